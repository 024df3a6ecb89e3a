"""Ascend 310P vNPU decisions and bind annotations, in both modes, with each Volcano quirk that
compat="volcano" keeps and the default fixes."""

from __future__ import annotations

from typing import Any

import pytest

from deviceplugin.fit.ascend import AscendFit
from deviceplugin.fit.ascend_config import ASCEND310P, DEFAULT_VNPUS
from deviceplugin.fit.errors import RequestError
from deviceplugin.fit.families import AscendFamily, DeviceFamily, ascend_families
from deviceplugin.fit.families.ascend import release_keys
from deviceplugin.fit.model import DEFAULT_VGPU_CONFIG, Assigned, Compat, FitResult, GpuState
from deviceplugin.fit.vgpu import node_score
from tests.fit.ascend_builders import (
    ALLOCATED,
    CORE,
    COUNT,
    MEMORY,
    MODE,
    REGISTER,
    card,
    node,
    npu_pod,
    registration,
)

BOTH: tuple[Compat, ...] = (None, "volcano")
NOW_NS = 1_700_000_000_987_654_321
C = DEFAULT_VGPU_CONFIG


def _keep_order(items: list[Any]) -> None:
    """compat's tie order: registration order, so a case with ties is deterministic."""


def _reverse(items: list[Any]) -> None:
    items.reverse()


FAMILY = AscendFamily(ASCEND310P, shuffle=_keep_order)


def _fit(
    cards: list[GpuState], pod: dict[str, Any], compat: Compat, policy: str | None = "binpack"
) -> FitResult:
    return FAMILY.fit(cards, pod, FAMILY.request(pod, compat), policy=policy, compat=compat, config=C)


def _binds(result: FitResult, compat: Compat) -> dict[str, str]:
    return FAMILY.bind_annotations(result, "node-a", NOW_NS, compat)


def test_the_family_is_a_device_family() -> None:
    family: DeviceFamily = FAMILY  # mypy holds it to the interface
    assert family.resources == (COUNT, MEMORY, CORE)
    assert FAMILY.ignored_resources == (MEMORY, CORE)
    assert [f.name for f in ascend_families(DEFAULT_VNPUS)] == ["Ascend310P"]


# --- the golden case: A holds a vir04; a pod asks 1 card and 4096 MiB (trimmed to vir02) ----------


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    ("policy", "uuid", "score", "weighted"),
    [("binpack", "NPU-A", 100 * 12288 / 21527, 57 * 3), ("spread", "NPU-B", 100.0, 100 * 3)],
)
def test_template_pod_binds_exactly_as_volcano(
    policy: str, uuid: str, score: float, weighted: int, compat: Compat
) -> None:
    cards = FAMILY.node_gpus(node({REGISTER: registration("NPU-A", "NPU-B")}), C, compat)
    FAMILY.book(cards, npu_pod("held", annotations={ALLOCATED: "NPU-A,Ascend310P,12288,0:;"}), compat, C)
    result = _fit(cards, npu_pod("p", {COUNT: "1", MEMORY: "4096"}), compat, policy)
    assert result.ok and result.score == score
    assert node_score(result.score, 3) == weighted
    assert _binds(result, compat) == {
        "hami.io/Ascend310P-devices-to-allocate": f"{uuid},Ascend310P,6144,0:;",
        "hami.io/Ascend310P-devices-allocated": f"{uuid},Ascend310P,6144,0:;",
        "huawei.com/Ascend310P": f'[{{"UUID":"{uuid}","temp":"vir02"}}]',
        "predicate-time": "1700000000",
        "hami.io/vgpu-node": "node-a",
        "hami.io/vgpu-time": "1700000000",
        "hami.io/bind-phase": "allocating",
        "hami.io/bind-time": "1700000000",
    }


@pytest.mark.parametrize("compat", BOTH)
def test_two_whole_cards_have_no_template(compat: Compat) -> None:
    result = _fit([card("NPU-A"), card("NPU-B", index=1)], npu_pod("p", {COUNT: "2"}), compat)
    notes = _binds(result, compat)
    assert (
        notes["hami.io/Ascend310P-devices-to-allocate"]
        == "NPU-A,Ascend310P,21527,0:NPU-B,Ascend310P,21527,0:;"
    )
    assert notes["huawei.com/Ascend310P"] == '[{"UUID":"NPU-A"},{"UUID":"NPU-B"}]'


@pytest.mark.parametrize("compat", BOTH)
def test_several_cards_with_partial_memory_are_refused(compat: Compat) -> None:
    result = _fit([card("NPU-A"), card("NPU-B", index=1)], npu_pod("p", {COUNT: "2", MEMORY: "4096"}), compat)
    assert not result.ok and "must be whole cards" in result.reason


@pytest.mark.parametrize("compat", BOTH)
def test_a_card_with_every_slot_taken_is_refused_though_memory_is_free(compat: Compat) -> None:
    result = _fit([card("NPU-A", used=(7, 7 * 100, 0))], npu_pod("p", {MEMORY: "1"}), compat)
    assert not result.ok
    assert _fit([card("NPU-A", used=(6, 6 * 100, 0))], npu_pod("p", {MEMORY: "1"}), compat).ok


@pytest.mark.parametrize("compat", BOTH)
def test_one_card_never_serves_two_containers_of_a_pod(compat: Compat) -> None:
    pod = npu_pod("p", {COUNT: "1", MEMORY: "3072"}, {COUNT: "1", MEMORY: "3072"})
    assert not _fit([card("NPU-A")], pod, compat).ok
    result = _fit([card("NPU-A"), card("NPU-B", index=1)], pod, compat)
    assert _binds(result, compat)["hami.io/Ascend310P-devices-allocated"] == (
        "NPU-A,Ascend310P,3072,0:;NPU-B,Ascend310P,3072,0:;"
    )


@pytest.mark.parametrize("compat", BOTH)
def test_hami_core_pod_binds_memory_and_cores(compat: Compat) -> None:
    registered = node({REGISTER: registration("NPU-A", devcore=100), "hami-vnpu-core": "true"})
    cards = FAMILY.node_gpus(registered, C, compat)
    pod = npu_pod("p", {COUNT: "1", MEMORY: "4096", CORE: "90"}, annotations=MODE)
    result = _fit(cards, pod, compat)
    assert isinstance(result, AscendFit) and result.hami_core
    notes = _binds(result, compat)
    assert notes["hami.io/Ascend310P-devices-to-allocate"] == "NPU-A,Ascend310P,4096,90:;"  # not trimmed
    assert notes["huawei.com/Ascend310P"] == '[{"UUID":"NPU-A","memory":4096,"core":90}]'
    template_node = FAMILY.node_gpus(node({REGISTER: registration("NPU-A")}), C, compat)
    assert not _fit(template_node, pod, compat).ok  # a node without hami-core serves templates only


@pytest.mark.parametrize("compat", BOTH)
def test_hami_core_defaults_come_from_the_config(compat: Compat) -> None:
    unmarked = node({REGISTER: registration("NPU-A")})
    assert AscendFamily(ASCEND310P, hami_vnpu_core=True).node_gpus(unmarked, C, compat)[0].mode == "hami-core"
    marked = node({REGISTER: registration("NPU-A"), "hami-vnpu-core": "TRUE"})  # only "true" means yes
    assert AscendFamily(ASCEND310P, hami_vnpu_core=True).node_gpus(marked, C, compat)[0].mode == "template"


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize("allocatable", [{}, {COUNT: "0"}])
def test_a_node_without_the_count_resource_has_no_cards(allocatable: dict[str, str], compat: Compat) -> None:
    assert FAMILY.node_gpus(node({REGISTER: registration("NPU-A")}, allocatable), C, compat) == []
    assert FAMILY.node_gpus(node({}), C, compat) == []


@pytest.mark.parametrize("compat", BOTH)
def test_release_drops_every_chip_key_until_the_plugin_reports_success(compat: Compat) -> None:
    result = _fit([card("NPU-A")], npu_pod("p", {COUNT: "1"}), compat)
    notes = _binds(result, compat)
    assert set(release_keys(notes, [FAMILY])) == set(notes)
    assert release_keys({**notes, "hami.io/bind-phase": "success"}, [FAMILY]) == ()


@pytest.mark.parametrize("compat", BOTH)
def test_unbook_takes_the_pod_off(compat: Compat) -> None:
    cards = [card("NPU-A")]
    FAMILY.book(cards, npu_pod("held", annotations={ALLOCATED: "NPU-A,Ascend310P,12288,0:;"}), compat, C)
    FAMILY.unbook(cards, "uid-held", compat, C)
    assert (cards[0].used_num, cards[0].used_memory, cards[0].used_cores, dict(cards[0].pods)) == (
        0,
        0,
        0,
        {},
    )


# --- quirk 1: the ledger counts only the first requesting container ------------------------------


@pytest.mark.parametrize(("compat", "booked"), [(None, (1, 3072)), ("volcano", (0, 0))])
def test_second_container_is_counted_by_default_only(compat: Compat, booked: tuple[int, int]) -> None:
    cards = [card("NPU-A"), card("NPU-B", index=1)]
    value = "NPU-A,Ascend310P,6144,0:;NPU-B,Ascend310P,3072,0:;"
    FAMILY.book(cards, npu_pod("held", annotations={ALLOCATED: value}), compat, C)
    assert (cards[0].used_num, cards[0].used_memory) == (1, 6144)
    assert (cards[1].used_num, cards[1].used_memory) == booked


# --- quirk 2: memory above the card's capacity ---------------------------------------------------


def test_oversize_memory_is_booked_as_zero_and_bound_as_vir01_under_volcano() -> None:
    result = _fit([card("NPU-A")], npu_pod("p", {COUNT: "1", MEMORY: "30000"}), "volcano")
    notes = _binds(result, "volcano")
    assert notes["hami.io/Ascend310P-devices-allocated"] == "NPU-A,Ascend310P,0,0:;"
    assert notes["huawei.com/Ascend310P"] == '[{"UUID":"NPU-A","temp":"vir01"}]'


def test_oversize_memory_is_refused_by_default() -> None:
    with pytest.raises(RequestError, match=r"30000 MiB, above the 24576 MiB of a Ascend310P card"):
        FAMILY.request(npu_pod("p", {COUNT: "1", MEMORY: "30000"}), None)


# --- quirk 3: health ---------------------------------------------------------------------------


@pytest.mark.parametrize(("compat", "chosen"), [(None, "NPU-B"), ("volcano", "NPU-A")])
def test_unhealthy_cards_are_used_by_volcano_only(compat: Compat, chosen: str) -> None:
    cards = FAMILY.node_gpus(node({REGISTER: registration("NPU-A", "NPU-B")}), C, compat)
    cards[0].health = False
    result = _fit(cards, npu_pod("p", {COUNT: "1"}), compat)
    assert result.devices[0][0].uuid == chosen
    cards[1].health = False
    assert _fit(cards, npu_pod("p", {COUNT: "1"}), compat).ok is (compat == "volcano")


def test_a_node_of_unhealthy_cards_says_so() -> None:
    result = _fit([card("NPU-A", health=False)], npu_pod("p", {COUNT: "1"}), None)
    assert result.reason == "no healthy Ascend310P card is registered on the node"


# --- quirk 4: the order of tied cards ------------------------------------------------------------


def test_tied_cards_go_in_registration_order_by_default() -> None:
    family = AscendFamily(ASCEND310P, shuffle=_reverse)  # the default never shuffles
    cards = [card("NPU-A"), card("NPU-B", index=1)]
    pod = npu_pod("p", {COUNT: "1"})
    for policy in ("binpack", "spread", None):
        result = family.fit(cards, pod, family.request(pod, None), policy=policy, compat=None, config=C)
        assert result.devices[0][0].uuid == "NPU-A"


def test_tied_cards_go_in_any_order_under_volcano() -> None:
    """Go's map order and an unstable sort: any tied card may win, a better-scored one first."""
    family = AscendFamily(ASCEND310P, shuffle=_reverse)
    pod = npu_pod("p", {COUNT: "1", MEMORY: "3072"})
    cards = [card("NPU-A"), card("NPU-B", index=1), card("NPU-C", index=2, used=(1, 3072, 0))]
    result = family.fit(
        cards[:2], pod, family.request(pod, "volcano"), policy="binpack", compat="volcano", config=C
    )
    assert result.devices[0][0].uuid == "NPU-B"
    result = family.fit(
        cards, pod, family.request(pod, "volcano"), policy="binpack", compat="volcano", config=C
    )
    assert result.devices[0][0].uuid == "NPU-C"


# --- Volcano's other readings -------------------------------------------------------------------


def test_a_count_of_zero_takes_one_card_or_none_under_volcano() -> None:
    result = _fit([card("NPU-A")], npu_pod("p", {COUNT: "0"}), "volcano")
    assert result.devices == ((result.devices[0][0],),) and result.devices[0][0].uuid == "NPU-A"
    full = _fit([card("NPU-A", used=(7, 0, 0))], npu_pod("p", {COUNT: "0"}), "volcano")
    assert full.ok and full.devices == ((),) and full.score == 0
    notes = _binds(full, "volcano")
    assert (notes["hami.io/Ascend310P-devices-allocated"], notes["huawei.com/Ascend310P"]) == (";", "null")
    assert not FAMILY.request(npu_pod("p", {COUNT: "0"}), None).wants  # by default it asks nothing


def test_runtime_json_escapes_as_go_does() -> None:
    result = AscendFit(ok=True, devices=((card_device("a<b>&c\u2028"),),), hami_core=True)
    assert (
        _binds(result, "volcano")["huawei.com/Ascend310P"]
        == '[{"UUID":"a\\u003cb\\u003e\\u0026c\\u2028","memory":5}]'
    )


def card_device(uuid: str) -> Assigned:
    return Assigned(uuid, 0, "Ascend310P", 5, 0)


def test_no_memory_asks_the_whole_first_card_in_hami_core_mode() -> None:
    cards = [card("NPU-A", hami_core=True, memory=20000), card("NPU-B", index=1, hami_core=True)]
    result = _fit(cards, npu_pod("p", {COUNT: "1"}, annotations=MODE), None)
    assert result.devices[0][0].memory == 20000
