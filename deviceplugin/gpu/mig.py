"""The backend-independent half of dynamic MIG: which profile table a card uses, where a geometry
group's instances go, creating them all or none, slot order, and matching a pre-partitioned card
to a group. The tables themselves (NVIDIA's profiles, the built-in knownMigGeometries) are in
`deviceplugin.fit.mig_tables`, which the scheduler extender reads too; they are re-exported here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from deviceplugin.fit.mig_tables import (
    MIG_MODELS,
    MigModel,
    MigProfile,
    builtin_geometries,
    known_mig_geometries,
)
from deviceplugin.fit.model import MigGroup
from deviceplugin.gpu.base import MigDevice, MigError, MigMatch

__all__ = [
    "MIG_MODELS",
    "MigModel",
    "MigProfile",
    "builtin_geometries",
    "create_all",
    "group_profiles",
    "known_mig_geometries",
    "layout",
    "match_group",
    "model_for",
    "plan",
    "profile_of",
    "require_model",
    "slot_order",
]

T = TypeVar("T")


_MEMORY_TOLERANCE = 0.1  # an H100 NVL (94 GB, other profiles) is not an H100 80GB


def model_for(product_name: str, memory_mib: int) -> MigModel | None:
    """The profile table of a card, from NVML's product name and total memory; None if unknown."""
    candidates = [
        model
        for model in MIG_MODELS
        if model.family in product_name
        and abs(memory_mib - model.memory_mib) <= model.memory_mib * _MEMORY_TOLERANCE
    ]
    return min(candidates, key=lambda model: abs(memory_mib - model.memory_mib), default=None)


def require_model(product_name: str, memory_mib: int) -> MigModel:
    model = model_for(product_name, memory_mib)
    if model is None:
        supported = ", ".join(m.key for m in MIG_MODELS)
        raise MigError(
            f"dynamic MIG does not know the {product_name} ({memory_mib} MiB); supported: {supported}"
        )
    return model


def profile_of(model: MigModel, name: str) -> MigProfile:
    found = model.find(name)
    if found is None:
        known = ", ".join(p.name for p in model.profiles)
        raise MigError(f"{name} is not a MIG profile of the {model.key} (its profiles: {known})")
    return found


def layout(profiles: Iterable[str]) -> str:
    """`3g.40gb x2 + 1g.10gb x1`: a multiset of profiles for messages ("no MIG instances" if empty)."""
    counts = Counter(profiles)
    return " + ".join(f"{name} x{count}" for name, count in counts.items()) or "no MIG instances"


def group_profiles(group: MigGroup) -> list[str]:
    return [inst.name for inst in group.instances for _ in range(inst.count)]


def plan(model: MigModel, group: MigGroup) -> list[tuple[MigProfile, int]]:
    """Placements for every instance of the group on an empty card, in the group's order; MigError
    naming the profile or the group when it cannot be placed."""
    wanted = [profile_of(model, name) for name in group_profiles(group)]
    for name, count in Counter(p.name for p in wanted).items():
        limit = profile_of(model, name).max_count
        if count > limit:
            raise MigError(f"group {group.name} asks {count} x {name}; the {model.key} holds at most {limit}")
    # Widest first: they have the fewest starts, so the search settles them before filling gaps.
    order = sorted(range(len(wanted)), key=lambda i: -wanted[i].span)
    starts: dict[int, int] = {}

    def place(k: int, used: frozenset[int]) -> bool:
        if k == len(order):
            return True
        profile = wanted[order[k]]
        for start in profile.starts:
            cells = frozenset(range(start, start + profile.span))
            if not cells & used and place(k + 1, used | cells):
                starts[order[k]] = start
                return True
        return False

    if not place(0, frozenset()):
        raise MigError(
            f"no free placement for group {group.name} ({layout(group_profiles(group))}) on the {model.key}: "
            "its instances do not fit the card together"
        )
    return [(profile, starts[i]) for i, profile in enumerate(wanted)]


def create_all(
    steps: Sequence[tuple[MigProfile, int]],
    create: Callable[[MigProfile, int], T],
    destroy: Callable[[T], None],
) -> list[T]:
    """Create every step or none: on a failure what was created is destroyed again, newest first."""
    created: list[T] = []
    try:
        for profile, start in steps:
            created.append(create(profile, start))
    except MigError as err:
        for item in reversed(created):
            try:
                destroy(item)
            except MigError as undo:
                raise MigError(f"{err}; removing the instances created before it failed too: {undo}") from err
        raise
    return created


def slot_order(devices: Sequence[MigDevice], group: MigGroup) -> tuple[MigDevice, ...]:
    """The devices as the group numbers its slots: its instance types in order, each by position."""
    left = sorted(devices, key=lambda device: device.start)
    ordered: list[MigDevice] = []
    for inst in group.instances:
        taken = [device for device in left if device.profile == inst.name][: inst.count]
        if len(taken) != inst.count:
            raise MigError(f"the card holds {layout(d.profile for d in devices)}, not group {group.name}")
        ordered.extend(taken)
        left = [device for device in left if device not in taken]
    return tuple(ordered)


def match_group(devices: Sequence[MigDevice], groups: Sequence[MigGroup]) -> MigMatch | None:
    """The first group that is exactly the card's devices (one compute instance per GI)."""
    if not devices or len({device.gpu_instance for device in devices}) != len(devices):
        return None
    held = Counter(device.profile for device in devices)
    for group in groups:
        if Counter(group_profiles(group)) == held:
            return MigMatch(group.name, slot_order(devices, group))
    return None
