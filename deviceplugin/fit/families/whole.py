"""The `whole` family (`nvidia.com/gpu`, docs/whole.md): whole idle GPUs, as NVIDIA's device plugin
serves them, fitted and bound by the `number` family's rules on a node read as a number node.

A pod the extender binds gets `volcano.sh/gpu-index` (and `predicate-time`), as a number pod. A pod
placed without the extender (a plain kube-scheduler, kubelet picking the GPUs) has none until the
node's daemon serves it and writes the GPUs kubelet gave it; until then it is booked by count, on
the node's first idle cards, so the extender never offers its GPUs twice.

`compat` is not read: Volcano has no whole-GPU mode (its scheduler counts `nvidia.com/gpu` as any
extended resource), so there is no Volcano choice to reproduce and both modes fit alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deviceplugin.fit import keys, objects
from deviceplugin.fit.codec import parse_gpu_index
from deviceplugin.fit.errors import PodFormatError
from deviceplugin.fit.families.gpushare import NumberFamily
from deviceplugin.fit.family import PodRequest
from deviceplugin.fit.gpushare import pod_nvidia_gpus
from deviceplugin.fit.keys import Strategy
from deviceplugin.fit.model import Compat, FitResult, GpuState, PodUsage, VgpuConfig
from deviceplugin.fit.policy import Policy
from deviceplugin.fit.quantity import go_quantity_value
from deviceplugin.fit.topology import Topology
from deviceplugin.fit.usage import remove_gpushare_pod


def _as_number_node(node: objects.Obj) -> objects.Obj:
    """The node as a number node shows it: `gpu-number` = its `nvidia.com/gpu` capacity. A node
    whose plugin does not name its unhealthy GPUs (NVIDIA's: kubelet only lowers allocatable)
    gets its last cards marked unhealthy, as many as allocatable falls short of the healthy ones."""
    capacity = objects.status_resources(node, "capacity")
    given = node.get("status")
    status: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    cards = capacity.get(keys.NVIDIA_GPU)
    if cards is None:
        return {**node, "status": {**status, "capacity": {}}}
    view = {**node, "status": {**status, "capacity": {keys.GPU_NUMBER: cards}}}
    allocatable = objects.status_resources(node, "allocatable").get(keys.NVIDIA_GPU)
    notes = objects.annotations_of(node)
    if allocatable is None or keys.GPU_UNHEALTHY_IDS in notes:
        return view
    count, usable = go_quantity_value(cards), go_quantity_value(allocatable)
    if usable >= count:
        return view
    down = ",".join(str(index) for index in range(max(usable, 0), count))
    meta = {**objects.metadata(node), "annotations": {**notes, keys.GPU_UNHEALTHY_IDS: down}}
    return {**view, "metadata": meta}


def _indices(pod: objects.Obj, cards: Sequence[GpuState], need: int) -> set[int]:
    """The cards a placed pod holds: its `gpu-index`, else (bound without the extender, not served
    yet) the first `need` cards, idle healthy ones first."""
    value = objects.annotations_of(pod).get(keys.GPU_INDEX)
    if value is not None:
        return set(parse_gpu_index(value))
    order = sorted(cards, key=lambda card: (bool(card.pods) or not card.health, card.index))
    return {card.index for card in order[:need]}


def book_whole_pod(cards: Sequence[GpuState], pod: objects.Obj) -> None:
    """Put a placed `nvidia.com/gpu` pod on its cards (see `_indices`); adding it again after its
    annotations changed moves it."""
    uid = objects.uid(pod)
    if not uid:
        raise PodFormatError(f"pod {objects.display_name(pod)} has no metadata.uid")
    remove_gpushare_pod(cards, uid)
    need = pod_nvidia_gpus(pod)
    if need <= 0:
        return
    held = _indices(pod, cards, need)
    for card in cards:
        if card.index in held:
            usage = PodUsage(uid=uid, name=objects.namespaced_name(pod), group=objects.podgroup_key(pod))
            card.pods = {**card.pods, uid: usage}
            card.used_num += 1


class WholeFamily(NumberFamily):
    """Whole idle cards for `nvidia.com/gpu`; bound by `gpu-index` as `number` is."""

    strategy: Strategy = "whole"

    def request(self, pod: objects.Obj, compat: Compat) -> PodRequest:
        need = pod_nvidia_gpus(pod)
        return PodRequest(need > 0, units=need, quick=True)

    def node_gpus(self, node: objects.Obj, config: VgpuConfig, compat: Compat) -> list[GpuState]:
        return super().node_gpus(_as_number_node(node), config, None)

    def fit(
        self,
        gpus: Sequence[GpuState],
        pod: objects.Obj,
        request: PodRequest,
        *,
        policy: str | None,
        compat: Compat,
        config: VgpuConfig,
        topology: Topology | None = None,
    ) -> FitResult:
        return super().fit(gpus, pod, request, policy=policy, compat=None, config=config, topology=topology)

    def quick_cards(
        self, gpus: Sequence[GpuState], policy: Policy, compat: Compat
    ) -> Sequence[GpuState] | None:
        return super().quick_cards(gpus, policy, None)

    def bind_annotations(self, result: FitResult, node: str, now_ns: int, compat: Compat) -> dict[str, str]:
        return super().bind_annotations(result, node, now_ns, None)

    def book(self, gpus: Sequence[GpuState], pod: objects.Obj, compat: Compat, config: VgpuConfig) -> None:
        book_whole_pod(gpus, pod)
