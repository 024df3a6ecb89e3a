"""Dynamic MIG: choosing a slot of a geometry group on a card, and booking slots from annotations.

A card in `mig` mode is partitioned into one geometry group at a time; each instance type of the
group has `count` slots, numbered by position across the group (`GroupSlot`). Volcano's slot
choice is reproduced under compat="volcano" (`pick_slot_volcano`); the default (`pick_slot`)
fixes two of its bugs: a slot taken by an earlier container of the same pod is not offered again
(B9), and every instance type with a free slot is offered, not only those already in use (B21).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deviceplugin.fit.errors import PodDevicesError
from deviceplugin.fit.model import MigGeometry, MigGroup, MigInstance, MigState


@dataclass(frozen=True, slots=True)
class GroupSlot:
    """A chosen slot: group number within the card's geometry, its name, position, slot memory."""

    group: int
    name: str
    position: int
    memory: int


def geometry_for(card_type: str, geometries: Sequence[MigGeometry]) -> MigGeometry | None:
    """The first configured geometry one of whose model names occurs in the card type."""
    for geometry in geometries:
        if any(model in card_type for model in geometry.models):
            return geometry
    return None


def _by_memory(group: MigGroup) -> list[tuple[int, MigInstance]]:
    return sorted(enumerate(group.instances), key=lambda item: item[1].memory)


def _first_free(count: int, taken: Sequence[int]) -> int | None:
    return next((slot for slot in range(count) if slot not in taken), None)


def pick_slot(
    state: MigState, used: Mapping[str, Sequence[int]], active: int, request: int
) -> GroupSlot | None:
    """Smallest instance with at least `request` memory and a free slot.

    `used`/`active` are the card's slots and group including what this fit already took. A card
    with slots in use stays in its group; an idle card may take any group, in configured order.
    """
    in_use = any(used.values())
    candidates = [active] if in_use and active >= 0 else range(len(state.groups))
    for number in candidates:
        group = state.groups[number]
        for index, inst in _by_memory(group):
            if inst.memory < request:
                continue
            free = _first_free(inst.count, used.get(inst.name, ()))
            if free is not None:
                return GroupSlot(number, group.name, group.offset(index) + free, inst.memory)
    return None


def _pick_from_group_volcano(
    group: MigGroup, used: Mapping[str, Sequence[int]], request: int
) -> tuple[int, int] | None:
    for index, inst in _by_memory(group):
        if not used and inst.memory >= request:
            return group.offset(index), inst.memory
        taken = used.get(inst.name)
        if taken is not None and inst.count - len(taken) > 0 and inst.memory >= request:
            free = _first_free(inst.count, taken)
            return group.offset(index) + (free or 0), inst.memory
    return None


def pick_slot_volcano(state: MigState, request: int) -> GroupSlot | None:
    """Volcano's `findMatch`: the active group only (even once it is empty again); else groups in
    order, each as if unused. Only instance types that already have a usage entry are offered on
    a card in use."""
    if state.active >= 0:
        if state.active >= len(state.groups):
            return None
        group = state.groups[state.active]
        found = _pick_from_group_volcano(group, state.used, request)
        return None if found is None else GroupSlot(state.active, group.name, found[0], found[1])
    for number, group in enumerate(state.groups):
        found = _pick_from_group_volcano(group, {}, request)
        if found is not None:
            return GroupSlot(number, group.name, found[0], found[1])
    return None


def take_slot(state: MigState, group_name: str, position: int) -> int | None:
    """Book a slot named by an annotation; returns the slot's memory, or None when the group or
    position is unknown to the card's geometry (nothing is booked then)."""
    for number, group in enumerate(state.groups):
        if group.name != group_name:
            continue
        located = group.locate(position)
        if located is None:
            return None
        instance, slot = located
        inst = group.instances[instance]
        state.active = number
        taken = state.used.setdefault(inst.name, [])
        if slot not in taken:
            taken.append(slot)
            taken.sort()
        return inst.memory
    return None


def take_slot_volcano(state: MigState, group_name: str, position: int) -> int:
    """Volcano's `addMigUsed`: like `take_slot`, but a group it does not know books 0 MiB, and a
    position past the group's slots is an error (Go indexes instance -1 there and panics)."""
    for group in state.groups:
        if group.name == group_name and group.locate(position) is None:
            raise PodDevicesError(
                f"MIG slot {group_name}-{position} is past the {sum(i.count for i in group.instances)} "
                "slots of its group: Volcano's scheduler panics booking it"
            )
    return take_slot(state, group_name, position) or 0


def release_slot_volcano(state: MigState, group_name: str, position: int) -> int:
    """Volcano's `subMigUsed`: re-pins the card to the released slot's group (even an idle card),
    frees the slot, and returns the memory of the instance type's usage entry: 0 when that type
    has no entry left (its memory then stays booked on the card)."""
    for number, group in enumerate(state.groups):
        if group.name != group_name:
            continue
        state.active = number
        located = group.locate(position)
        assert located is not None, "booked slots are in range: take_slot_volcano refuses the others"
        inst = group.instances[located[0]]
        taken = state.used.get(inst.name)
        if taken is None:
            return 0
        if located[1] in taken:
            taken.remove(located[1])
        if not taken:
            del state.used[inst.name]
        return inst.memory
    return 0


def release_slot(state: MigState, group_name: str, position: int, reset_group: bool) -> None:
    """Free a slot; `reset_group` lets an idle card repartition (Volcano keeps the group, B21)."""
    for group in state.groups:
        if group.name != group_name:
            continue
        located = group.locate(position)
        if located is None:
            return
        inst = group.instances[located[0]]
        taken = state.used.get(inst.name)
        if taken is not None and located[1] in taken:
            taken.remove(located[1])
            if not taken:
                del state.used[inst.name]
        if reset_group and not state.used:
            state.active = -1
        return
