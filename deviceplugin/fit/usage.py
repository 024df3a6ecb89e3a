"""Node views for a scheduler: GPUs from what the plugin publishes, usage from the pods on them.

`gpushare_cards` and `vgpu_gpus` build a node's `GpuState`s; `add_*_pod` / `remove_*_pod` keep
them current as pods come and go (adding a pod twice counts it once; adding it again after its
annotations changed replaces its entry). These are the only functions here that mutate GpuStates.

Which pods hold GPUs (`holds_gpus`): by default every pod that has not finished, terminating pods
included (their containers still run, B18). Volcano's scheduler cache never books a Succeeded or
Failed pod, and books neither a Running nor a Pending pod once it is being deleted (Releasing); a
pod in phase Unknown, or with no phase, is booked even while being deleted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from deviceplugin.fit import goint, keys, objects
from deviceplugin.fit.bounds import MAX_NODE_GPUS
from deviceplugin.fit.codec import (
    decode_mig_id,
    decode_mig_id_volcano,
    decode_node_register,
    decode_pod_devices,
    parse_gpu_index,
    parse_gpu_index_volcano,
    parse_unhealthy_ids,
    physical_uuid,
)
from deviceplugin.fit.errors import PodFormatError, QuantityError
from deviceplugin.fit.gpushare import pod_gpu_memory, pod_gpu_number
from deviceplugin.fit.mig import (
    geometry_for,
    release_slot,
    release_slot_volcano,
    take_slot,
    take_slot_volcano,
)
from deviceplugin.fit.model import (
    DEFAULT_VGPU_CONFIG,
    NO_PODS,
    Assigned,
    Compat,
    GpuState,
    MigState,
    PodUsage,
    VgpuConfig,
    is_volcano_compat,
)
from deviceplugin.fit.quantity import go_quantity_value, parse_quantity

_RELEASING_PHASES = ("Running", "Pending")


def holds_gpus(pod: objects.Obj, compat: Compat = None) -> bool:
    """Whether a pod bound to the node counts toward GPU usage.

    Volcano: `cache/event_handlers.go:addTask` skips finished pods, `node_info.go:AddTask` books
    no devices for a Releasing task, and `api/helpers.go:getTaskStatus` makes only a Running or
    Pending pod with a deletionTimestamp Releasing (Unknown and empty phases stay booked).
    """
    if objects.is_terminal(pod):
        return False
    if is_volcano_compat(compat):
        deleting = bool(objects.metadata(pod).get("deletionTimestamp"))
        return not (deleting and objects.phase(pod) in _RELEASING_PHASES)
    return True


_NO_LABELS: Mapping[str, str] = {}  # typed read-only: PodUsage.labels is never written


def _labels(pod: objects.Obj) -> Mapping[str, str]:
    """A copy of the pod's labels; one shared empty map for the many pods without (a scheduler
    keeps a usage per pod per card)."""
    labels = objects.labels_of(pod)
    return dict(labels) if labels else _NO_LABELS


def _new_usage(pod: objects.Obj, volcano: bool) -> PodUsage:
    return PodUsage(
        uid=objects.uid(pod),
        name=objects.namespaced_name(pod),
        group=objects.podgroup_key(pod),
        labels=_labels(pod),
        terminal=volcano and objects.is_terminal(pod),
    )


_AMOUNTS_KEPT = 4096  # distinct amounts remembered; past it the memo starts afresh
_amounts: dict[int, int] = {}


def _amount(value: int) -> int:
    """One int object per amount of memory: a scheduler holds a few per card of the cluster, and
    each int above 256 is an object of its own (32 bytes) though the amounts repeat."""
    found = _amounts.get(value)
    if found is None:
        if len(_amounts) >= _AMOUNTS_KEPT:
            _amounts.clear()
        found = _amounts[value] = value
    return found


def _hold(card: GpuState, uid: str, usage: PodUsage) -> None:
    """Record `usage` as the card's entry for pod `uid` (a card holding none gets a dict)."""
    if isinstance(card.pods, dict):
        card.pods[uid] = usage
    else:
        card.pods = {**card.pods, uid: usage}


def _release(card: GpuState, uid: str) -> PodUsage | None:
    """Take pod `uid`'s entry off the card, if it has one; a card left with none shares `NO_PODS`."""
    pods = card.pods
    if uid not in pods:
        return None
    usage = pods[uid]
    if len(pods) == 1:
        card.pods = NO_PODS
    elif isinstance(pods, dict):
        del pods[uid]
    else:
        card.pods = {key: held for key, held in pods.items() if key != uid}
    return usage


def _uid(pod: objects.Obj) -> str:
    uid = objects.uid(pod)
    if not uid:
        raise PodFormatError(f"pod {objects.display_name(pod)} has no metadata.uid")
    return uid


# --- gpushare --------------------------------------------------------------------------------


def gpushare_cards(
    node: objects.Obj, pods: Iterable[objects.Obj] = (), compat: Compat = None
) -> list[GpuState]:
    """Cards of a gpushare node: capacity `gpu-memory` split evenly over `gpu-number` cards (the
    remainder is dropped), `gpu-unhealthy-ids` marked unhealthy, usage from `pods` on the node.
    More than `bounds.MAX_NODE_GPUS` cards is a `QuantityError`, in both modes."""
    capacity = objects.status_resources(node, "capacity")
    total, number = capacity.get(keys.GPU_MEMORY), capacity.get(keys.GPU_NUMBER)
    if total is None or number is None:
        return []
    count = go_quantity_value(number)
    if count <= 0:
        return []
    if count > MAX_NODE_GPUS:
        # Volcano would build that many cards (2^63-1 for "1e30"): out of memory, not a node.
        raise QuantityError(f"capacity {keys.GPU_NUMBER} is {count}; a node has at most {MAX_NODE_GPUS} GPUs")
    per_card = _amount(goint.int64_div(go_quantity_value(total), count))
    name = objects.metadata(node).get("name") or "node"
    unhealthy = parse_unhealthy_ids(objects.annotations_of(node).get(keys.GPU_UNHEALTHY_IDS, ""), compat)
    cards = [
        GpuState(index=i, uuid=f"{name}-gpu-{i}", memory=per_card, health=i not in unhealthy)
        for i in range(count)
    ]
    for pod in pods:
        if holds_gpus(pod, compat):
            add_gpushare_pod(cards, pod, compat)
    return cards


def add_gpushare_pod(cards: Sequence[GpuState], pod: objects.Obj, compat: Compat = None) -> None:
    """Put a pod on the cards its `volcano.sh/gpu-index` names (Volcano's AddResource).

    A pod without a gpushare request or without the annotation holds nothing. An unreadable
    annotation is an error by default; Volcano ignores it. The pod is booked as given: callers
    decide with `holds_gpus` which pods to add (as `gpushare_cards` does).
    """
    volcano = is_volcano_compat(compat)
    uid = _uid(pod)
    remove_gpushare_pod(cards, uid)
    memory = _amount(pod_gpu_memory(pod, compat))
    if memory <= 0 and pod_gpu_number(pod, compat) <= 0:
        return
    value = objects.annotations_of(pod).get(keys.GPU_INDEX)
    if value is None:
        return
    indices = parse_gpu_index_volcano(value) if volcano else parse_gpu_index(value)
    if indices is None:
        return
    wanted = set(indices)
    for card in cards:
        if card.index in wanted:
            usage = _new_usage(pod, volcano)
            usage.memory = memory
            _hold(card, uid, usage)
            card.used_num += 1
            if not usage.terminal:
                card.used_memory = _amount(card.used_memory + memory)


def remove_gpushare_pod(cards: Sequence[GpuState], uid: str) -> None:
    """Take a pod off every card (Volcano's SubResource)."""
    for card in cards:
        usage = _release(card, uid)
        if usage is not None:
            card.used_num -= 1
            if not usage.terminal:
                card.used_memory = _amount(card.used_memory - usage.memory)


# --- vGPU ------------------------------------------------------------------------------------


def vgpu_gpus(
    node: objects.Obj,
    pods: Iterable[objects.Obj] = (),
    *,
    config: VgpuConfig = DEFAULT_VGPU_CONFIG,
    compat: Compat = None,
) -> list[GpuState]:
    """GPUs of a vGPU node from `volcano.sh/node-vgpu-register`, with usage from `pods`.

    Like Volcano, a node has vGPUs only when its allocatable `vgpu-number`, `vgpu-cores` and
    `vgpu-memory` are all non-zero. A `mig` card gets the first configured geometry whose model
    occurs in its type; without one Volcano falls back to HAMi-core, while the default keeps it
    `mig` with no geometry, so the fit rejects it with a reason instead of mis-sharing it.
    """
    volcano = is_volcano_compat(compat)
    value = objects.annotations_of(node).get(keys.NODE_VGPU_REGISTER)
    if value is None:
        return []
    allocatable = objects.status_resources(node, "allocatable")
    for resource in (keys.VGPU_NUMBER, keys.VGPU_CORES, keys.VGPU_MEMORY):
        amount = allocatable.get(resource)
        if amount is None or (go_quantity_value if volcano else parse_quantity)(amount) == 0:
            return []
    gpus = decode_node_register(value, compat)
    for gpu in gpus:
        gpu.memory = _amount(gpu.memory)
        if gpu.mode != keys.MODE_MIG:
            continue
        geometry = geometry_for(gpu.type, config.mig_geometries)
        if geometry is not None:
            gpu.mig = MigState(groups=geometry.groups)
        elif volcano:
            gpu.mode = keys.MODE_HAMI_CORE
    for pod in pods:
        if holds_gpus(pod, compat):
            add_vgpu_pod(gpus, pod, compat, config=config)
    return gpus


def add_vgpu_pod(
    gpus: Sequence[GpuState],
    pod: objects.Obj,
    compat: Compat = None,
    *,
    config: VgpuConfig = DEFAULT_VGPU_CONFIG,
) -> None:
    """Book a pod's devices from `volcano.sh/vgpu-ids-new` on the GPUs (Volcano's AddResource).

    Default: devices match cards by exact UUID (a MIG device by the UUID before `[`), and every
    device entry is booked, so two containers on one card count twice (B17, B19). Volcano matches
    the first card whose UUID is a substring of the device's and books a pod once per card.
    Like `add_gpushare_pod`, it books the pod as given; `holds_gpus` says which pods to add.
    """
    value = objects.annotations_of(pod).get(keys.VGPU_IDS_NEW)
    if value is None:
        return
    uid = _uid(pod)
    if is_volcano_compat(compat):
        _add_vgpu_volcano(gpus, pod, uid, decode_pod_devices(value, compat=compat), config)
        return
    containers = decode_pod_devices(value)
    remove_vgpu_pod(gpus, uid)
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    entries: defaultdict[str, list[Assigned]] = defaultdict(list)
    for devices in containers:
        for device in devices:
            if physical_uuid(device.uuid) in by_uuid:
                entries[physical_uuid(device.uuid)].append(device)
    factor = max(config.memory_factor, 1)
    for card_uuid, devices in entries.items():
        card = by_uuid[card_uuid]
        usage = _new_usage(pod, volcano=False)
        usage.slots = len(devices)
        mig_slots = []
        for device in devices:
            booked = device.memory
            if card.mig is not None and "[" in device.uuid:
                _, group, position = decode_mig_id(device.uuid)
                slot_memory = take_slot(card.mig, group, position)
                if slot_memory is not None:
                    booked = slot_memory // factor
                    mig_slots.append((group, position))
            usage.memory += booked
            usage.cores += device.cores
        usage.memory = _amount(usage.memory)
        usage.mig_slots = tuple(mig_slots)
        _hold(card, uid, usage)
        card.used_num += usage.slots
        card.used_memory = _amount(card.used_memory + usage.memory)
        card.used_cores += usage.cores


def _add_vgpu_volcano(
    gpus: Sequence[GpuState], pod: objects.Obj, uid: str, containers: list[list[Assigned]], config: VgpuConfig
) -> None:
    mig_node = bool(gpus) and gpus[-1].mode == keys.MODE_MIG
    factor = config.memory_factor if config.memory_factor > 1 else 1
    for devices in containers:
        for device in devices:
            card = next((g for g in gpus if g.uuid in device.uuid), None)
            if card is None or uid in card.pods:
                continue
            booked = device.memory
            mig_slots: tuple[tuple[str, int], ...] = ()
            if mig_node:
                parsed = decode_mig_id_volcano(device.uuid)
                if parsed is None:
                    continue
                slot_memory = take_slot_volcano(card.mig, *parsed) if card.mig is not None else 0
                booked = slot_memory // factor
                mig_slots = (parsed,)
            usage = _new_usage(pod, volcano=True)
            usage.memory, usage.cores, usage.mig_slots = _amount(booked), device.cores, mig_slots
            _hold(card, uid, usage)
            card.used_num += 1
            card.used_memory = _amount(card.used_memory + booked)
            card.used_cores += device.cores


def remove_vgpu_pod(
    gpus: Sequence[GpuState],
    uid: str,
    compat: Compat = None,
    *,
    config: VgpuConfig = DEFAULT_VGPU_CONFIG,
) -> None:
    """Release what a pod holds on every card (Volcano's SubResource).

    Volcano releases a MIG slot through `subMigUsed`: the card is re-pinned to the slot's group
    and the memory given back is that of the instance type's remaining usage entry (0 if none).
    """
    volcano = is_volcano_compat(compat)
    factor = max(config.memory_factor, 1)
    for gpu in gpus:
        usage = _release(gpu, uid)
        if usage is None:
            continue
        released = usage.memory
        if gpu.mig is not None:
            if volcano and usage.mig_slots:
                released = sum(release_slot_volcano(gpu.mig, *slot) for slot in usage.mig_slots) // factor
            else:
                for group, position in usage.mig_slots:
                    release_slot(gpu.mig, group, position, not volcano)
        gpu.used_num -= usage.slots
        gpu.used_memory = _amount(gpu.used_memory - released)
        gpu.used_cores -= usage.cores
