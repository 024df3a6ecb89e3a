"""Dynamic MIG mode (semantics reference §3.8): geometry lookup, slot choice, booking and release,
and the two Volcano bugs the default fixes (B9: one slot given twice in a pod; B21: instance types
not yet in use are never offered and an emptied card stays pinned to its group)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from deviceplugin.fit import (
    Compat,
    FitResult,
    GpuState,
    MigGeometry,
    MigGroup,
    MigInstance,
    VgpuConfig,
    add_vgpu_pod,
    fit_vgpu,
    parse_vgpu_requests,
    remove_vgpu_pod,
    vgpu_gpus,
)
from tests.fit.builders import MEM, NUM, container, pod, vgpu_node

BOTH: list[Compat] = [None, "volcano"]
A100 = "NVIDIA-A100-SXM4-80GB"
GEOMETRY = MigGeometry(
    models=("A100-SXM4-80GB", "A100 80GB PCIe"),
    groups=(
        MigGroup("group1", (MigInstance("1g.10gb", 10240, 7),)),
        MigGroup("group2", (MigInstance("2g.20gb", 20480, 3), MigInstance("1g.10gb", 10240, 1))),
        MigGroup("group3", (MigInstance("3g.40gb", 40960, 2),)),
    ),
)
CONFIG = VgpuConfig(mig_geometries=(GEOMETRY,))


def mig_card(compat: Compat = None, config: VgpuConfig = CONFIG, kind: str = A100) -> list[GpuState]:
    return vgpu_gpus(vgpu_node(f"GPU-m,7,81920,{kind},true,mig:"), config=config, compat=compat)


def mig_fit(
    cards: list[GpuState], *memories: int, compat: Compat = None, config: VgpuConfig = CONFIG
) -> FitResult:
    p = pod("new", [container(f"c{i}", {NUM: "1", MEM: str(m)}) for i, m in enumerate(memories)])
    return fit_vgpu(cards, parse_vgpu_requests(p, config, compat), p, "binpack", compat, config=config)


def ids(result: FitResult) -> list[str]:
    assert result.ok, result.reason
    return [device.uuid for devices in result.devices for device in devices]


def tenant(
    cards: list[GpuState],
    *device_ids: str,
    compat: Compat = None,
    name: str = "tenant",
    config: VgpuConfig = CONFIG,
) -> dict[str, Any]:
    value = "".join(f"{d},NVIDIA,1000,0:" for d in device_ids)
    p = pod(name, [], annotations={"volcano.sh/vgpu-ids-new": value})
    add_vgpu_pod(cards, p, compat, config=config)
    return p


@pytest.mark.parametrize("compat", BOTH)
def test_geometry_is_found_by_model_name_in_the_card_type(compat: Compat) -> None:
    (card,) = mig_card(compat)
    assert card.mode == "mig"
    assert card.mig is not None
    assert card.mig.groups == GEOMETRY.groups
    assert card.mig.active == -1


def test_card_without_geometry_volcano_falls_back_default_refuses() -> None:
    (volcano,) = mig_card("volcano", kind="NVIDIA-H100 80GB HBM3")
    assert (volcano.mode, volcano.mig) == ("hami-core", None)
    assert ids(mig_fit([volcano], 5000, compat="volcano")) == ["GPU-m"]  # shared as HAMi-core
    (default,) = mig_card(kind="NVIDIA-H100 80GB HBM3")
    assert (default.mode, default.mig) == ("mig", None)
    result = mig_fit([default], 5000)
    assert not result.ok
    assert "MIG card with no configured geometry for type 'NVIDIA-H100 80GB HBM3'" in result.reason


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        (5000, "GPU-m[group1-0]"),  # first group whose smallest fitting instance has room
        (10240, "GPU-m[group1-0]"),
        (15000, "GPU-m[group2-0]"),  # 2g.20gb is instance 0 of group2
        (30000, "GPU-m[group3-0]"),
    ],
)
def test_idle_card_slot_choice(compat: Compat, memory: int, expected: str) -> None:
    result = mig_fit(mig_card(compat), memory, compat=compat)
    assert ids(result) == [expected]
    assert result.devices[0][0].memory == memory  # the annotation carries the request, not the slot


@pytest.mark.parametrize("compat", BOTH)
def test_request_bigger_than_every_slot(compat: Compat) -> None:
    result = mig_fit(mig_card(compat), 50000, compat=compat)
    assert not result.ok


@pytest.mark.parametrize(
    ("compat", "expected"),
    [(None, ["GPU-m[group2-0]", "GPU-m[group2-1]"]), ("volcano", ["GPU-m[group2-0]", "GPU-m[group2-0]"])],
)
def test_two_containers_of_one_pod(compat: Compat, expected: list[str]) -> None:
    """B9: Volcano does not reserve the slot between containers, so both get position 0."""
    assert ids(mig_fit(mig_card(compat), 15000, 15000, compat=compat)) == expected


@pytest.mark.parametrize("compat", BOTH)
def test_booking_from_the_annotation(compat: Compat) -> None:
    cards = mig_card(compat)
    tenant(cards, "GPU-m[group2-0]", compat=compat)
    (card,) = cards
    assert card.mig is not None
    assert card.mig.active == 1
    assert card.mig.used == {"2g.20gb": [0]}
    assert (card.used_num, card.used_memory) == (1, 20480)  # the slot's memory is booked


@pytest.mark.parametrize(("compat", "expected"), [(None, "GPU-m[group2-3]"), ("volcano", "GPU-m[group2-1]")])
def test_card_in_use_offers_only_its_group(compat: Compat, expected: str) -> None:
    """B21: with 2g.20gb in use, Volcano never offers group2's unused 1g.10gb instance."""
    cards = mig_card(compat)
    tenant(cards, "GPU-m[group2-0]", compat=compat)
    assert ids(mig_fit(cards, 5000, compat=compat)) == [expected]
    assert not mig_fit(cards, 30000, compat=compat).ok  # group3 would need a repartition


@pytest.mark.parametrize(("compat", "fits"), [(None, True), ("volcano", False)])
def test_emptied_card_may_repartition(compat: Compat, fits: bool) -> None:
    """B21: Volcano keeps the card pinned to its last group after every slot is freed."""
    cards = mig_card(compat)
    p = tenant(cards, "GPU-m[group2-0]", compat=compat)
    remove_vgpu_pod(cards, p["metadata"]["uid"], compat)
    (card,) = cards
    assert card.mig is not None
    assert card.mig.used == {}
    assert (card.used_num, card.used_memory) == (0, 0)
    result = mig_fit(cards, 30000, compat=compat)
    assert result.ok is fits
    if fits:
        assert ids(result) == ["GPU-m[group3-0]"]


@pytest.mark.parametrize("compat", BOTH)
def test_full_instance_type_is_skipped(compat: Compat) -> None:
    cards = mig_card(compat)
    for position in range(3):
        tenant(cards, f"GPU-m[group2-{position}]", compat=compat, name=f"t{position}")
    expected = "GPU-m[group2-3]" if compat is None else None
    result = mig_fit(cards, 15000, compat=compat)
    assert not result.ok  # all 2g.20gb slots are taken and 1g.10gb is too small
    small = mig_fit(cards, 5000, compat=compat)
    if expected is None:
        assert not small.ok  # Volcano: 1g.10gb has no usage entry, so it is never offered
    else:
        assert ids(small) == [expected]


def test_memory_factor_scales_the_request_and_the_booking() -> None:
    config = VgpuConfig(memory_factor=2, mig_geometries=(GEOMETRY,))
    for compat in BOTH:
        cards = vgpu_gpus(vgpu_node(f"GPU-m,7,40960,{A100},true,mig:"), config=config, compat=compat)
        assert ids(mig_fit(cards, 6000, compat=compat, config=config)) == ["GPU-m[group2-0]"]  # 12000 MiB
        tenant(cards, "GPU-m[group2-0]", compat=compat, config=config)
        assert cards[0].used_memory == 10240  # 20480 MiB in factor-2 units


@pytest.mark.parametrize(("compat", "slots", "memory"), [(None, 2, 40960), ("volcano", 1, 20480)])
def test_two_entries_of_one_pod_on_a_card(compat: Compat, slots: int, memory: int) -> None:
    """B19: Volcano books a pod once per card when rebuilding from the annotation."""
    cards = mig_card(compat)
    tenant(cards, "GPU-m[group2-0]", "GPU-m[group2-1]", compat=compat)
    assert (cards[0].used_num, cards[0].used_memory) == (slots, memory)


def test_unknown_group_or_position_books_no_slot() -> None:
    cards = mig_card()
    tenant(cards, "GPU-m[group9-0]", name="a")
    tenant(cards, "GPU-m[group1-99]", name="b")
    assert cards[0].mig is not None
    assert cards[0].mig.used == {}
    assert cards[0].used_num == 2  # the pods still occupy share slots


def _node_mode(compat: Compat, modes: Mapping[int, str]) -> list[GpuState]:
    register = "".join(f"GPU-{i},7,81920,{A100},true,{modes[i]}:" for i in sorted(modes))
    return vgpu_gpus(vgpu_node(register), config=CONFIG, compat=compat)


def test_volcano_uses_mig_sharing_on_every_card_of_a_mig_node() -> None:
    cards = _node_mode("volcano", {0: "hami-core", 1: "mig"})
    # The node is `mig` (last card); card 0 has no geometry, so only card 1 can give a slot.
    assert ids(mig_fit(cards, 5000, compat="volcano")) == ["GPU-1[group1-0]"]
    default = _node_mode(None, {0: "hami-core", 1: "mig"})
    assert ids(mig_fit(default, 5000)) == ["GPU-0"]  # binpack tie: lower index, shared as HAMi-core
