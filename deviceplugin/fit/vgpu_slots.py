"""Which containers own a slot of `volcano.sh/devices-to-allocate` (Volcano's container rule).

Volcano's `ExtractResourceRequest` (`pkg/scheduler/api/devices/util.go`) walks the app containers
only (never init containers) and makes a request, hence a `;`-separated slot, for each one whose
*limits* carry the count resource or, failing that, the memory resource (memory alone means one
device). A container that asks only for cores or a memory percentage gets no slot, and what the
other resources say (percentage together with memory, defaults, odd values) changes the devices
the slot holds, never which container holds it. Decoding the slot is the codec's job.
"""

from __future__ import annotations

from dataclasses import dataclass

from deviceplugin.fit import objects
from deviceplugin.fit.model import DEFAULT_VGPU_CONFIG, VgpuConfig


@dataclass(frozen=True, slots=True)
class SlotOwner:
    """An app container with a slot. `by_count`: its limits carry the count resource (it holds
    that many devices); otherwise the memory resource alone gave it one device."""

    name: str
    by_count: bool


def vgpu_slot_owners(pod: objects.Obj, config: VgpuConfig = DEFAULT_VGPU_CONFIG) -> list[SlotOwner]:
    """The slot owners in container order: slot i of devices-to-allocate belongs to owner i."""
    owners = []
    for container in objects.containers(pod):
        limits = objects.limits(container)
        by_count = config.count_resource in limits
        if by_count or config.memory_resource in limits:
            owners.append(SlotOwner(objects.container_name(container), by_count))
    return owners
