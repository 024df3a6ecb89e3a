"""The Ascend vNPU families (Volcano `deviceshare`, HAMi mode): one per configured chip.

Unlike the GPU strategies, a chip's family is not picked by the node's strategy label: a node
has it when its allocatable holds the chip's count resource and its HAMi Ascend device plugin
registered chips under `hami.io/node-register-<commonWord>`, whatever GPU strategy runs beside it.
Thin wrapper over `fit.ascend`, `fit.ascend_usage`, `fit.ascend_register` and `fit.ascend_bind`.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Mapping, Sequence

from deviceplugin.fit import objects
from deviceplugin.fit.ascend import (
    HAMI_CORE,
    TEMPLATE_MODE,
    Shuffle,
    fit_ascend,
    node_runs_hami_core,
    parse_ascend_requests,
)
from deviceplugin.fit.ascend_bind import NODE_LOCK, ascend_bind_annotations, ascend_release_keys
from deviceplugin.fit.ascend_config import VnpuChip, VnpusConfig
from deviceplugin.fit.ascend_register import decode_npu_register
from deviceplugin.fit.ascend_usage import add_ascend_pod, remove_ascend_pod
from deviceplugin.fit.family import PodRequest
from deviceplugin.fit.model import Compat, FitResult, GpuState, VgpuConfig, is_volcano_compat
from deviceplugin.fit.policy import Policy
from deviceplugin.fit.quantity import go_quantity_value, parse_quantity


class AscendFamily:
    """One chip's vNPUs (count, memory, cores) per container. `config` arguments are the GPU
    families' and are not read: the chip and the `hamiVnpuCore` default are the family's own."""

    scores_per_device = False  # the score is Volcano's ScoreNode: each container's first card, summed
    node_lock = NODE_LOCK  # what Volcano's NodeLockEnable takes on the node before a bind

    def __init__(
        self, chip: VnpuChip, hami_vnpu_core: bool = False, shuffle: Shuffle = random.shuffle
    ) -> None:
        self.chip = chip
        self.hami_vnpu_core = hami_vnpu_core
        self._shuffle = shuffle  # compat="volcano": the order of tied cards (Go's map order)

    @property
    def name(self) -> str:
        return self.chip.common_word

    @property
    def resources(self) -> tuple[str, ...]:
        chip = self.chip
        return (chip.resource_name, chip.resource_memory_name, chip.resource_core_name)

    @property
    def ignored_resources(self) -> tuple[str, ...]:
        """No node advertises these: kube-scheduler must be told to ignore them (the extender's
        `managedResources` with `ignoredByScheduler: true`), or no pod setting them fits."""
        return (self.chip.resource_memory_name, self.chip.resource_core_name)

    def request(self, pod: objects.Obj, compat: Compat) -> PodRequest:
        requests = tuple(parse_ascend_requests(pod, self.chip, compat))
        return PodRequest(bool(requests), requests)

    def node_gpus(self, node: objects.Obj, config: VgpuConfig, compat: Compat) -> list[GpuState]:
        """The node's chips: none unless its allocatable count resource is above 0 and it
        registered chips of this type."""
        chip = self.chip
        amount = objects.status_resources(node, "allocatable").get(chip.resource_name)
        read = go_quantity_value if is_volcano_compat(compat) else parse_quantity
        if amount is None or read(amount) == 0:
            return []
        value = objects.annotations_of(node).get(chip.register_key)
        if value is None:
            return []
        mode = HAMI_CORE if node_runs_hami_core(node, self.hami_vnpu_core) else TEMPLATE_MODE
        return [
            GpuState(
                index=position,
                uuid=info.id,
                type=sys.intern(info.type or chip.common_word),
                memory=info.devmem,
                split_count=info.count,
                cores=info.devcore,
                health=info.health,
                mode=mode,
            )
            for position, info in enumerate(decode_npu_register(value, compat))
        ]

    def fit(
        self,
        gpus: Sequence[GpuState],
        pod: objects.Obj,
        request: PodRequest,
        *,
        policy: str | None,
        compat: Compat,
        config: VgpuConfig,
    ) -> FitResult:
        return fit_ascend(
            gpus, pod, request.containers, self.chip, policy=policy, compat=compat, shuffle=self._shuffle
        )

    def quick_cards(
        self, gpus: Sequence[GpuState], policy: Policy, compat: Compat
    ) -> Sequence[GpuState] | None:
        return None  # only `fit` decides: a node has a handful of chips

    def quick(
        self, cards: Sequence[GpuState], request: PodRequest, policy: Policy
    ) -> tuple[float, int] | None:
        return None

    def bind_annotations(self, result: FitResult, node: str, now_ns: int, compat: Compat) -> dict[str, str]:
        return ascend_bind_annotations(result, self.chip, node, now_ns, compat)

    def book(self, gpus: Sequence[GpuState], pod: objects.Obj, compat: Compat, config: VgpuConfig) -> None:
        add_ascend_pod(gpus, pod, self.chip, compat)

    def unbook(self, gpus: Sequence[GpuState], uid: str, compat: Compat, config: VgpuConfig) -> None:
        remove_ascend_pod(gpus, uid, compat)


def ascend_families(vnpus: VnpusConfig, shuffle: Shuffle = random.shuffle) -> tuple[AscendFamily, ...]:
    """One family per configured chip, in configured order (Volcano registers them so)."""
    return tuple(AscendFamily(chip, vnpus.hami_vnpu_core, shuffle) for chip in vnpus.chips)


def release_keys(annotations: Mapping[str, str], families: Sequence[AscendFamily]) -> tuple[str, ...]:
    """What undoing an Ascend binding drops (`fit.ascend_bind.ascend_release_keys`, for every
    configured chip)."""
    return ascend_release_keys(annotations, (family.chip for family in families))
