"""Ascend card usage rebuilt from `hami.io/<commonWord>-devices-allocated` (Volcano's ledger).

The value is `UUID,commonWord,memory,cores:` per card with `;` after each requesting container
(`devices.EncodePodSingleDevice`). Volcano's Ascend ledger (`addResource`) runs
`devices.DecodeContainerDevices` over the whole value without splitting it on `;`, so the first
card of every container after the first reads as UUID `;<id>`, matches no card and is never
counted (a two-container pod books only its first container's cards). compat="volcano" keeps
that, with Go's reading of the numbers (a bad number is 0, an out-of-range one is clamped to
int32, and an entry of fewer than four fields voids the pod's whole value); the default decodes
the value per container with the project's strict codec and counts every container.
"""

from __future__ import annotations

from collections.abc import Sequence

from deviceplugin.fit import goint, objects
from deviceplugin.fit.ascend_config import VnpuChip
from deviceplugin.fit.codec import decode_pod_devices
from deviceplugin.fit.model import Assigned, Compat, GpuState, PodUsage, is_volcano_compat


def decode_allocated_volcano(value: str) -> list[Assigned] | None:
    """`devices.DecodeContainerDevices` of a whole pod value; None where Go returns an error."""
    devices = []
    for piece in value.split(":"):
        if "," not in piece:
            continue
        fields = piece.split(",")
        if len(fields) < 4:
            return None
        memory = goint.parse_int(fields[2], 32)[0]  # ParseInt's error ignored: 0, or the clamped value
        cores = goint.parse_int(fields[3], 32)[0]
        devices.append(Assigned(uuid=fields[0], index=None, type=fields[1], memory=memory, cores=cores))
    return devices


def allocated_devices(pod: objects.Obj, chip: VnpuChip, compat: Compat = None) -> list[Assigned]:
    """The cards the pod's `-devices-allocated` annotation books (empty when it has none);
    PodDevicesError by default when the value does not decode."""
    value = objects.annotations_of(pod).get(chip.allocated_key)
    if not value:
        return []
    if is_volcano_compat(compat):
        return decode_allocated_volcano(value) or []
    return [device for container in decode_pod_devices(value, "hami") for device in container]


def add_ascend_pod(
    cards: Sequence[GpuState], pod: objects.Obj, chip: VnpuChip, compat: Compat = None
) -> None:
    """Count a placed pod's cards. Volcano books a pod once per card (its `PodMap`) and adds in
    int32; the default counts a card named twice twice."""
    volcano = is_volcano_compat(compat)
    wrap = goint.int32 if volcano else int
    by_uuid = {card.uuid: card for card in cards}
    uid = objects.uid(pod)
    for device in allocated_devices(pod, chip, compat):
        card = by_uuid.get(device.uuid)
        if card is None:  # a card the node no longer registers
            continue
        usage = card.pods.get(uid)
        if usage is None:
            usage = PodUsage(uid=uid, name=objects.namespaced_name(pod), memory=0, cores=0, slots=0)
            card.pods = {**card.pods, uid: usage}  # a new map: a card's map may be a shared empty one
        elif volcano:
            continue
        usage.slots += 1
        usage.memory = wrap(usage.memory + device.memory)
        usage.cores = wrap(usage.cores + device.cores)
        card.used_num += 1
        card.used_memory = wrap(card.used_memory + device.memory)
        card.used_cores = wrap(card.used_cores + device.cores)


def remove_ascend_pod(cards: Sequence[GpuState], uid: str, compat: Compat = None) -> None:
    """Take the pod with `uid` off every card it was counted on."""
    wrap = goint.int32 if is_volcano_compat(compat) else int
    for card in cards:
        usage = card.pods.get(uid)
        if usage is not None:
            card.pods = {key: held for key, held in card.pods.items() if key != uid}
            card.used_num -= usage.slots
            card.used_memory = wrap(card.used_memory - usage.memory)
            card.used_cores = wrap(card.used_cores - usage.cores)
