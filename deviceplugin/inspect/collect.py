"""One node's report from its Node object and the pods bound to it, through the shared-fit library.

Every reading that can fail is caught here and turned into a problem note on the node, so one
malformed annotation never hides the rest of the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from deviceplugin.fit import (
    FitInputError,
    GpuIndexError,
    GpuState,
    VgpuConfig,
    add_gpushare_pod,
    add_vgpu_pod,
    decode_node_register,
    gpushare_cards,
    holds_gpus,
    keys,
    objects,
    vgpu_gpus,
)
from deviceplugin.fit.families import family_of
from deviceplugin.fit.mig_tables import builtin_geometries
from deviceplugin.fit.topology import Topology, node_topology
from deviceplugin.inspect.ascend import carries_ascend, npu_cards
from deviceplugin.inspect.model import GpuReport, MigSlot, NodeReport, PodOnGpu, PodState
from deviceplugin.inspect.strategy import GPU_RESOURCES, detect_strategy, memory_factor, node_address

NO_GPUS = (
    f"publishes no GPU resource ({GPU_RESOURCES}), no {keys.NODE_VGPU_REGISTER} annotation "
    "and no Ascend cards: is the device plugin running on it?"
)


def node_report(node: objects.Obj, pods: Iterable[objects.Obj]) -> NodeReport:
    problems: list[str] = []
    name = ""
    pods = list(pods)
    try:
        name = str(objects.metadata(node).get("name") or "")
        strategy = detect_strategy(node)
        factor, factor_problem = memory_factor(node)
        ascend = carries_ascend(node)
    except FitInputError as err:
        return NodeReport(name, node_address(node), "unknown", 1, (), (f"node object unreadable: {err}",))
    read = _READERS.get(strategy)
    gpus: tuple[GpuReport, ...] = ()
    if read is not None:
        if factor_problem:
            problems.append(factor_problem)
        gpus = read(node, _active_pods(pods, problems), factor, problems)
    elif not ascend:  # "none": no GPU resource
        problems.append(NO_GPUS)
    npus = npu_cards(node, pods, problems) if ascend else ()
    topology = _topology(node, problems)
    return NodeReport(
        name, node_address(node), strategy, factor, gpus, tuple(problems), npus, ascend, topology
    )


def _topology(node: objects.Obj, problems: list[str]) -> Topology | None:
    """The published GPU interconnect; a malformed one is a note (the scheduler then chooses
    cards without it)."""
    try:
        return node_topology(node)
    except FitInputError as err:
        problems.append(f"{err}; cards are chosen without it")
        return None


def _active_pods(pods: Iterable[objects.Obj], problems: list[str]) -> dict[str, objects.Obj]:
    """Pods that hold GPUs (not Succeeded/Failed), by UID."""
    active: dict[str, objects.Obj] = {}
    for pod in pods:
        try:
            if holds_gpus(pod) and objects.uid(pod):
                active[objects.uid(pod)] = pod
        except FitInputError as err:
            problems.append(f"pod {_pod_name(pod)}: {err}")
    return active


def _pod_name(pod: objects.Obj) -> str:
    try:
        return objects.display_name(pod)
    except FitInputError:
        return "<unreadable pod>"


def _book(add: Callable[[objects.Obj], None], pods: Mapping[str, objects.Obj], problems: list[str]) -> None:
    for pod in pods.values():
        try:
            add(pod)
        except FitInputError as err:
            problems.append(f"pod {_pod_name(pod)}: {err}")


# --- share and number ---------------------------------------------------------------------------


def _with_status(node: objects.Obj, capacity: Mapping[str, str]) -> dict[str, Any]:
    status = dict(node.get("status") or {})
    status["capacity"] = {**dict(status.get("capacity") or {}), **capacity}
    return {**node, "status": status}


def _without_annotation(node: objects.Obj, key: str) -> dict[str, Any]:
    metadata = dict(node.get("metadata") or {})
    metadata["annotations"] = {k: v for k, v in (metadata.get("annotations") or {}).items() if k != key}
    return {**node, "metadata": metadata}


def _gpushare(
    node: objects.Obj, pods: Mapping[str, objects.Obj], factor: int, problems: list[str], *, number: bool
) -> tuple[GpuReport, ...]:
    # Number mode publishes no memory: zero memory per card keeps the fit's card list and booking.
    source = _with_status(node, {keys.GPU_MEMORY: "0"}) if number else node
    try:
        try:
            cards = gpushare_cards(source)
        except GpuIndexError as err:  # only `gpu-unhealthy-ids` is an index list on the node
            problems.append(f"{keys.GPU_UNHEALTHY_IDS}: {err}; GPU health unknown, shown as healthy")
            cards = gpushare_cards(_without_annotation(source, keys.GPU_UNHEALTHY_IDS))
    except FitInputError as err:
        problems.append(f"GPU capacity unreadable: {err}")
        return ()
    _book(lambda pod: add_gpushare_pod(cards, pod), pods, problems)
    return tuple(_gpushare_report(card, pods, factor, number) for card in cards)


def _gpushare_state(pod: objects.Obj) -> PodState:
    return "assigned" if objects.annotations_of(pod).get(keys.GPU_ASSIGNED) == "true" else "pending"


def _gpushare_report(card: GpuState, pods: Mapping[str, objects.Obj], factor: int, number: bool) -> GpuReport:
    on_card = tuple(
        _pod_on_gpu(pods[uid], None if number else usage.memory * factor, None, _gpushare_state(pods[uid]))
        for uid, usage in card.pods.items()
    )
    return GpuReport(
        index=card.index,
        uuid=None,
        model=None,
        healthy=card.health,
        memory_used_mib=None if number else card.used_memory * factor,
        memory_total_mib=None if number else card.memory * factor,
        cores_used=None,
        cores_total=None,
        pod_limit=None,
        pods=_sorted(on_card),
    )


def _whole(
    node: objects.Obj, pods: Mapping[str, objects.Obj], factor: int, problems: list[str]
) -> tuple[GpuReport, ...]:
    """`nvidia.com/gpu` cards, read and booked as the extender does (`fit.families.whole`): whole
    cards like number mode's."""
    family, config = family_of("whole"), VgpuConfig()
    try:
        cards = family.node_gpus(node, config, None)
    except FitInputError as err:
        problems.append(f"GPU capacity unreadable: {err}")
        return ()
    _book(lambda pod: family.book(cards, pod, None, config), pods, problems)
    return tuple(_gpushare_report(card, pods, factor, number=True) for card in cards)


# --- vGPU ---------------------------------------------------------------------------------------


def _vgpu(
    node: objects.Obj, pods: Mapping[str, objects.Obj], factor: int, problems: list[str]
) -> tuple[GpuReport, ...]:
    # inspect reads no device config: MIG slots by the daemon's built-in geometries
    config = VgpuConfig(memory_factor=factor, mig_geometries=builtin_geometries())
    register = objects.annotations_of(node).get(keys.NODE_VGPU_REGISTER)
    if register is None:
        problems.append(f"no {keys.NODE_VGPU_REGISTER} annotation: the plugin has not registered its GPUs")
        return ()
    try:
        gpus = vgpu_gpus(node, (), config=config)
        if not gpus:
            gpus = decode_node_register(register)
            if gpus:
                problems.append(
                    f"{keys.VGPU_NUMBER}, {keys.VGPU_MEMORY} and {keys.VGPU_CORES} are not all allocatable: "
                    "kubelet has not registered the plugin's resources, the scheduler will not use this node"
                )
    except FitInputError as err:
        problems.append(f"{keys.NODE_VGPU_REGISTER}: {err}")
        return ()
    _book(lambda pod: add_vgpu_pod(gpus, pod, config=config), pods, problems)
    return tuple(_vgpu_report(gpu, pods, factor) for gpu in gpus)


def _vgpu_state(pod: objects.Obj) -> PodState:
    phase = objects.annotations_of(pod).get(keys.BIND_PHASE)
    if phase == keys.BIND_PHASE_ALLOCATING:
        return "pending"
    return "failed" if phase == keys.BIND_PHASE_FAILED else "assigned"


def _vgpu_report(gpu: GpuState, pods: Mapping[str, objects.Obj], factor: int) -> GpuReport:
    on_gpu = tuple(
        _pod_on_gpu(pods[uid], usage.memory * factor, usage.cores, _vgpu_state(pods[uid]))
        for uid, usage in gpu.pods.items()
    )
    return GpuReport(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.type,
        healthy=gpu.health,
        memory_used_mib=gpu.used_memory * factor,
        memory_total_mib=gpu.memory * factor,
        cores_used=gpu.used_cores,
        cores_total=gpu.cores,
        pod_limit=gpu.split_count,
        pods=_sorted(on_gpu),
        mode=gpu.mode,
        mig_slots=tuple(sorted(_mig_slots(gpu, pods), key=lambda s: (s.group, s.position, s.uid))),
    )


def _mig_slots(gpu: GpuState, pods: Mapping[str, objects.Obj]) -> list[MigSlot]:
    slots = []
    for uid, usage in gpu.pods.items():
        meta = objects.metadata(pods[uid])
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        slots += [MigSlot(group, position, namespace, name, uid) for group, position in usage.mig_slots]
    return slots


Reader = Callable[[objects.Obj, Mapping[str, objects.Obj], int, list[str]], tuple[GpuReport, ...]]

# How each strategy's GPUs are read and shown (number mode shows whole cards, no memory).
_READERS: Mapping[str, Reader] = {
    "share": partial(_gpushare, number=False),
    "number": partial(_gpushare, number=True),
    "vgpu": _vgpu,
    "whole": _whole,
}


# --- pods ---------------------------------------------------------------------------------------


def _pod_on_gpu(pod: objects.Obj, memory: int | None, cores: int | None, state: PodState) -> PodOnGpu:
    meta = objects.metadata(pod)
    return PodOnGpu(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=objects.uid(pod),
        memory_mib=memory,
        cores=cores,
        state=state,
    )


def _sorted(pods: Sequence[PodOnGpu]) -> tuple[PodOnGpu, ...]:
    return tuple(sorted(pods, key=lambda pod: (pod.namespace, pod.name, pod.uid)))
