"""A node's Ascend vNPU cards and the pods on them, as the extender and Volcano count them.

The node side is HAMi's Ascend device plugin: the cards are its registration
(`hami.io/node-register-<commonWord>`, with the count resource in allocatable and `hami-vnpu-core`);
their use is rebuilt from each pod's `hami.io/<commonWord>-devices-allocated` (`fit.families`). The
chips are Volcano's built-in `vnpus` default (Ascend310P). A registration or a pod's value that
cannot be read is a problem note on the node.
"""

from __future__ import annotations

from collections.abc import Iterable

from deviceplugin.fit import FitInputError, objects
from deviceplugin.fit.ascend_bind import BIND_PHASE, BIND_PHASE_ALLOCATING
from deviceplugin.fit.ascend_config import DEFAULT_VNPUS
from deviceplugin.fit.families import AscendFamily, ascend_families
from deviceplugin.fit.model import DEFAULT_VGPU_CONFIG, GpuState
from deviceplugin.inspect.model import NpuCardReport, PodOnGpu, PodState

FAMILIES: tuple[AscendFamily, ...] = ascend_families(DEFAULT_VNPUS)


def carries_ascend(node: objects.Obj) -> bool:
    """The node publishes a chip's count resource or registration (so it is shown)."""
    allocatable = objects.status_resources(node, "allocatable")
    notes = objects.annotations_of(node)
    return any(f.chip.resource_name in allocatable or f.chip.register_key in notes for f in FAMILIES)


def npu_cards(
    node: objects.Obj, pods: Iterable[objects.Obj], problems: list[str]
) -> tuple[NpuCardReport, ...]:
    """Every configured chip's cards on the node with their use; what cannot be read goes to
    `problems`."""
    active = [pod for pod in pods if not objects.is_terminal(pod) and objects.uid(pod)]
    by_uid = {objects.uid(pod): pod for pod in active}
    reports: list[NpuCardReport] = []
    for family in FAMILIES:
        chip = family.chip
        try:
            cards = family.node_gpus(node, DEFAULT_VGPU_CONFIG, None)
        except FitInputError as err:
            problems.append(f"{chip.register_key}: {err}")
            continue
        if not cards and chip.register_key in objects.annotations_of(node):
            problems.append(
                f"{chip.register_key}: registered, but allocatable {chip.resource_name} is not above 0: "
                "kubelet has not registered the HAMi Ascend device plugin, the scheduler will not use it"
            )
        for pod in active:
            try:
                family.book(cards, pod, None, DEFAULT_VGPU_CONFIG)
            except FitInputError as err:
                family.unbook(cards, objects.uid(pod), None, DEFAULT_VGPU_CONFIG)
                problems.append(f"pod {_name(pod)}: {chip.allocated_key}: {err}")
        reports += [_card(chip.common_word, card, by_uid) for card in cards]
    return tuple(reports)


def _name(pod: objects.Obj) -> str:
    meta = objects.metadata(pod)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or objects.uid(pod)}"


def _state(pod: objects.Obj) -> PodState:
    return "pending" if objects.annotations_of(pod).get(BIND_PHASE) == BIND_PHASE_ALLOCATING else "assigned"


def _card(chip: str, card: GpuState, pods: dict[str, objects.Obj]) -> NpuCardReport:
    on_card = []
    for uid, usage in card.pods.items():
        namespace, _, name = _name(pods[uid]).partition("/")
        on_card.append(
            PodOnGpu(
                namespace=namespace,
                name=name,
                uid=uid,
                memory_mib=usage.memory,
                cores=usage.cores,
                state=_state(pods[uid]),
            )
        )
    return NpuCardReport(
        chip=chip,
        index=card.index,
        id=card.uuid,
        mode=card.mode,
        healthy=card.health,
        memory_used_mib=card.used_memory,
        memory_total_mib=card.memory,
        cores_used=card.used_cores,
        cores_total=card.cores,
        pod_limit=card.split_count,
        pods=tuple(sorted(on_card, key=lambda pod: (pod.namespace, pod.name, pod.uid))),
    )
