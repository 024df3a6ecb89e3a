"""Ascend decisions at their edges: what a request's error names, which containers ask nothing,
the exclusive 100-core hami-core card, a card whose cores are all taken, the reasons a fit gives,
the ledger of a pod (unknown and repeated cards), and Go's int32 arithmetic under
compat="volcano" against the default's plain integers."""

from __future__ import annotations

import re
from typing import Any

import pytest

from deviceplugin.fit.ascend import AscendFit
from deviceplugin.fit.ascend_config import ASCEND310P
from deviceplugin.fit.errors import ConfigError, RequestError
from deviceplugin.fit.families import AscendFamily
from deviceplugin.fit.model import DEFAULT_VGPU_CONFIG, Assigned, Compat, FitResult, GpuState, PodUsage
from tests.fit.ascend_builders import ALLOCATED, CORE, COUNT, MEMORY, MODE, card, chip, npu_pod
from tests.fit.builders import container, pod

BOTH: tuple[Compat, ...] = (None, "volcano")
C = DEFAULT_VGPU_CONFIG
NOW_NS = 1_700_000_000_000_000_000
INT32_MAX = 2**31 - 1


def _keep_order(items: list[Any]) -> None:
    """Ties in registration order, so every case is deterministic."""


FAMILY = AscendFamily(ASCEND310P, shuffle=_keep_order)


def _fit(
    cards: list[GpuState],
    a_pod: dict[str, Any],
    compat: Compat,
    policy: str | None = "binpack",
    family: AscendFamily = FAMILY,
) -> FitResult:
    return family.fit(cards, a_pod, family.request(a_pod, compat), policy=policy, compat=compat, config=C)


def _booked(result: FitResult) -> list[int]:
    return [device.memory for devices in result.devices for device in devices]


def _ledger(*memories: int, uuid: str = "NPU-A") -> str:
    return "".join(f"{uuid},Ascend310P,{memory},0:;" for memory in memories)


# --- requests --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "resource"),
    [({COUNT: "1.5"}, COUNT), ({COUNT: "1", MEMORY: "1.5"}, MEMORY), ({COUNT: "1", CORE: "-1"}, CORE)],
)
def test_a_bad_quantity_names_the_pod_container_and_resource(limits: dict[str, str], resource: str) -> None:
    with pytest.raises(RequestError, match=rf"^pod default/p container 'c0': {re.escape(resource)}"):
        FAMILY.request(npu_pod("p", limits), None)


@pytest.mark.parametrize("compat", BOTH)
def test_containers_without_the_chip_ask_nothing(compat: Compat) -> None:
    a_pod = pod(
        "p",
        [container("sidecar", {"cpu": "1"}), container("app", {COUNT: "1"})],
        init_containers=[container("setup", {"cpu": "1"})],
    )
    assert [request.name for request in FAMILY.request(a_pod, compat).containers] == ["app"]


def test_a_count_and_memory_of_zero_ask_nothing() -> None:
    assert not FAMILY.request(npu_pod("p", {COUNT: "0", MEMORY: "0"}), None).wants


@pytest.mark.parametrize("compat", BOTH)
def test_memory_given_as_a_request_only_is_read(compat: Compat) -> None:
    a_pod = pod("p", [container("c0", {COUNT: "1"}, {MEMORY: "4096"})])
    assert _booked(_fit([card("NPU-A")], a_pod, compat)) == [6144]  # vir02


def test_volcano_reads_a_memory_of_zero_as_the_whole_card() -> None:
    assert _booked(_fit([card("NPU-A")], npu_pod("p", {COUNT: "1", MEMORY: "0"}), "volcano")) == [21527]


def test_volcano_serves_a_card_registering_no_memory_a_whole_card_of_0_mib() -> None:
    """Volcano trims only memory above 0 to a template: the whole of a 0 MiB card is 0 MiB."""
    assert _booked(_fit([card("NPU-A", memory=0)], npu_pod("p", {COUNT: "1"}), "volcano")) == [0]


@pytest.mark.parametrize("compat", BOTH)
def test_one_mib_books_the_smallest_template(compat: Compat) -> None:
    assert _booked(_fit([card("NPU-A")], npu_pod("p", {COUNT: "1", MEMORY: "1"}), compat)) == [3072]


# --- a card registering more memory than the chip's capacity ---------------------------------
# HAMi's device plugin registers its configured memoryAllocatable as every card's devmem, so a card
# above the scheduler's memoryCapacity comes from a plugin configured for another chip.

OVERSIZED = "; card BIG-A registers 30000 MiB, above the 24576 MiB memoryCapacity of Ascend310P (its device "
OVERSIZED += "plugin is configured for another chip): no template pod is placed on it"


def test_volcano_books_the_whole_of_an_oversized_card_as_0_mib_bound_as_vir01() -> None:
    """trimMemory(30000) is 0 above the 24576 MiB capacity, and the bind names trimMemory(0): vir01."""
    result = _fit([card("BIG-A", memory=30000)], npu_pod("p", {COUNT: "1"}), "volcano")
    assert _booked(result) == [0]
    notes = FAMILY.bind_annotations(result, "node-a", NOW_NS, "volcano")
    assert (notes[ALLOCATED], notes["huawei.com/Ascend310P"]) == (
        "BIG-A,Ascend310P,0,0:;",
        '[{"UUID":"BIG-A","temp":"vir01"}]',
    )


def test_volcano_refuses_several_oversized_cards_as_partial_memory() -> None:
    """verifyReq trims the already trimmed 0 MiB again: vir01, not the whole card."""
    cards = [card("BIG-A", memory=30000), card("BIG-B", index=1, memory=30000)]
    result = _fit(cards, npu_pod("p", {COUNT: "2"}), "volcano")
    assert not result.ok and "must be whole cards" in result.reason


@pytest.mark.parametrize("limits", [{COUNT: "1"}, {COUNT: "2"}, {COUNT: "1", MEMORY: "3072"}])
def test_the_default_places_no_template_pod_on_an_oversized_card_and_says_why(limits: dict[str, str]) -> None:
    result = _fit([card("BIG-A", memory=30000)], npu_pod("p", limits), None)
    assert not result.ok
    assert result.reason == "no usable Ascend310P card is registered on the node" + OVERSIZED


def test_the_default_serves_a_whole_card_from_the_consistent_cards_beside_an_oversized_one() -> None:
    cards = [card("BIG-A", memory=30000), card("NPU-B", index=1)]
    result = _fit(cards, npu_pod("p", {COUNT: "1"}), None)
    assert [device.uuid for devices in result.devices for device in devices] == ["NPU-B"]
    assert _booked(result) == [21527]
    short = _fit(cards, npu_pod("p", {COUNT: "2"}), None)
    assert short.reason == (
        "container 'c0': 1 of the 2 Ascend310P cards it needs have 21527 MiB and 0 cores free (template mode)"
        + OVERSIZED
    )


@pytest.mark.parametrize("compat", BOTH)
def test_a_hami_core_pod_books_an_oversized_card_as_registered(compat: Compat) -> None:
    """hami-core memory is exact and never trimmed to a template: the capacity does not apply."""
    big = [card("BIG-A", memory=30000, hami_core=True)]
    assert _booked(_fit(big, npu_pod("p", {COUNT: "1"}, annotations=MODE), compat)) == [30000]


# --- cards -----------------------------------------------------------------------------------


@pytest.mark.parametrize("compat", BOTH)
def test_all_100_cores_of_a_hami_core_card_are_served_on_an_idle_card_only(compat: Compat) -> None:
    whole = npu_pod("p", {COUNT: "1", MEMORY: "1024", CORE: "100"}, annotations=MODE)
    assert _fit([card("NPU-A", hami_core=True)], whole, compat).ok
    holding_no_cores = card("NPU-A", hami_core=True, used=(1, 1024, 0))
    assert not _fit([holding_no_cores], whole, compat).ok
    half = npu_pod("p", {COUNT: "1", MEMORY: "1024", CORE: "50"}, annotations=MODE)
    assert _fit([card("NPU-A", hami_core=True, used=(1, 1024, 10))], half, compat).ok


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize("cores", [1, 8])
def test_a_card_whose_cores_are_all_taken_serves_no_pod(cores: int, compat: Compat) -> None:
    asking_no_cores = npu_pod("p", {COUNT: "1", MEMORY: "3072"})
    assert not _fit([card("NPU-A", cores=cores, used=(1, 3072, cores))], asking_no_cores, compat).ok
    assert _fit([card("NPU-A", cores=0)], asking_no_cores, compat).ok  # a card registering no cores


@pytest.mark.parametrize("compat", BOTH)
def test_a_pod_scores_the_sum_of_each_containers_first_card(compat: Compat) -> None:
    cards = [card("NPU-A", used=(1, 12288, 0)), card("NPU-B", index=1, used=(1, 6144, 0))]
    two = npu_pod("p", {COUNT: "1", MEMORY: "3072"}, {COUNT: "1", MEMORY: "3072"})
    assert _fit(cards, two, compat).score == 100 * 12288 / 21527 + 100 * 6144 / 21527


@pytest.mark.parametrize("compat", BOTH)
def test_an_unset_policy_scores_nothing(compat: Compat) -> None:
    held = [card("NPU-A", used=(1, 12288, 0))]
    result = _fit(held, npu_pod("p", {COUNT: "1", MEMORY: "3072"}), compat, policy=None)
    assert result.ok and result.score == 0


def test_an_unknown_policy_is_unset_under_volcano_and_refused_by_default() -> None:
    a_pod = npu_pod("p", {COUNT: "1"})
    assert _fit([card("NPU-A")], a_pod, "volcano", policy="binpak").ok
    with pytest.raises(ConfigError, match="schedule policy"):
        _fit([card("NPU-A")], a_pod, None, policy="binpak")


@pytest.mark.parametrize("compat", BOTH)
def test_a_refusal_names_the_container_and_the_mode(compat: Compat) -> None:
    full = [card("NPU-A", used=(7, 7 * 1024, 0), hami_core=True)]
    template = _fit(full, npu_pod("p", {COUNT: "1", MEMORY: "3072"}), compat)
    assert template.reason == (
        "container 'c0': 0 of the 1 Ascend310P cards it needs have 3072 MiB and 0 cores free (template mode)"
    )
    hami_core = _fit(full, npu_pod("p", {COUNT: "1", MEMORY: "3072"}, annotations=MODE), compat)
    assert hami_core.reason == (
        "container 'c0': 0 of the 1 Ascend310P cards it needs have 3072 MiB and 0 cores free (hami-core mode)"
    )
    several = _fit(full, npu_pod("p", {COUNT: "2", MEMORY: "3072"}), compat)
    assert several.reason.startswith("container 'c0': 2 Ascend310P cards must be whole cards")


# --- the ledger ------------------------------------------------------------------------------


@pytest.mark.parametrize("compat", BOTH)
def test_a_pod_is_booked_and_unbooked_with_its_memory_cores_and_slots(compat: Compat) -> None:
    cards = [card("NPU-A")]
    held = npu_pod("held", annotations={ALLOCATED: "NPU-A,Ascend310P,3072,30:;"})
    FAMILY.book(cards, held, compat, C)
    assert cards[0].pods == {"uid-held": PodUsage("uid-held", "default/held", memory=3072, cores=30, slots=1)}
    assert (cards[0].used_num, cards[0].used_memory, cards[0].used_cores) == (1, 3072, 30)
    FAMILY.unbook(cards, "uid-held", compat, C)
    assert (cards[0].used_num, cards[0].used_memory, cards[0].used_cores, cards[0].pods) == (0, 0, 0, {})


@pytest.mark.parametrize("compat", BOTH)
def test_a_card_the_node_no_longer_registers_is_skipped_not_the_rest(compat: Compat) -> None:
    cards = [card("NPU-A")]
    held = npu_pod("held", annotations={ALLOCATED: "GONE,Ascend310P,100,0:NPU-A,Ascend310P,200,0:;"})
    FAMILY.book(cards, held, compat, C)
    assert cards[0].used_memory == 200


@pytest.mark.parametrize(("compat", "booked"), [(None, (2, 200)), ("volcano", (1, 100))])
def test_a_card_named_twice_counts_twice_by_default_once_under_volcano(
    compat: Compat, booked: tuple[int, int]
) -> None:
    cards = [card("NPU-A"), card("NPU-B", index=1)]
    value = "NPU-A,Ascend310P,100,0:NPU-A,Ascend310P,100,0:NPU-B,Ascend310P,300,0:;"
    FAMILY.book(cards, npu_pod("held", annotations={ALLOCATED: value}), compat, C)
    assert (cards[0].used_num, cards[0].used_memory) == booked
    assert (cards[1].used_num, cards[1].used_memory) == (1, 300)
    FAMILY.unbook(cards, "uid-held", compat, C)
    assert [(c.used_num, c.used_memory) for c in cards] == [(0, 0), (0, 0)]


def test_volcano_skips_an_empty_entry_and_reads_the_next() -> None:
    cards = [card("NPU-A"), card("NPU-B", index=1)]
    value = "NPU-A,Ascend310P,100,0::NPU-B,Ascend310P,200,0:;"
    FAMILY.book(cards, npu_pod("held", annotations={ALLOCATED: value}), "volcano", C)
    assert [c.used_memory for c in cards] == [100, 200]


def test_volcano_clamps_ledger_cores_to_int32() -> None:
    cards = [card("NPU-A")]
    FAMILY.book(
        cards, npu_pod("held", annotations={ALLOCATED: "NPU-A,Ascend310P,100,3000000000:;"}), "volcano", C
    )
    assert cards[0].used_cores == INT32_MAX


# --- Go's int32 arithmetic under compat="volcano"; plain integers by default -----------------


@pytest.mark.parametrize(
    ("compat", "after_books", "after_unbooks"),
    [
        (None, [INT32_MAX, 2 * INT32_MAX, 3 * INT32_MAX], [2 * INT32_MAX, INT32_MAX, 0]),
        ("volcano", [INT32_MAX, -2, INT32_MAX - 2], [-2, INT32_MAX, 0]),
    ],
)
def test_booked_memory_adds_and_subtracts_in_int32_under_volcano_only(
    compat: Compat, after_books: list[int], after_unbooks: list[int]
) -> None:
    cards = [card("NPU-A")]
    names = ("p1", "p2", "p3")
    books = []
    for name in names:
        FAMILY.book(cards, npu_pod(name, annotations={ALLOCATED: _ledger(INT32_MAX)}), compat, C)
        books.append(cards[0].used_memory)
    unbooks = []
    for name in reversed(names):
        FAMILY.unbook(cards, f"uid-{name}", compat, C)
        unbooks.append(cards[0].used_memory)
    assert (books, unbooks) == (after_books, after_unbooks)


def test_volcano_finds_a_card_whose_booked_memory_wrapped_full() -> None:
    """21527 MiB less -2147483000 booked overflows int32 in Go, and the card has no room."""
    wrapped = card("NPU-A", used=(1, -2_147_483_000, 0))
    assert not _fit([wrapped], npu_pod("p", {COUNT: "1", MEMORY: "3072"}), "volcano").ok


@pytest.mark.parametrize(("compat", "booked"), [(None, 30_000_000), ("volcano", -12_949_672)])
def test_a_whole_card_request_is_computed_in_int32_under_volcano(compat: Compat, booked: int) -> None:
    """Volcano: 30000000 MiB x 100 wraps in int32 before the division by 100; the bind writes the
    negative memory as it is."""
    huge = [card("NPU-A", memory=30_000_000, hami_core=True)]
    result = _fit(huge, npu_pod("p", {COUNT: "1"}, annotations=MODE), compat)
    assert _booked(result) == [booked]
    allocated = FAMILY.bind_annotations(result, "node-a", NOW_NS, compat)[ALLOCATED]
    assert allocated == f"NPU-A,Ascend310P,{booked},0:;"


def test_the_default_serves_memory_beyond_int32() -> None:
    huge = [card("NPU-A", memory=3_000_000_000, hami_core=True)]
    asking = npu_pod("p", {COUNT: "1", MEMORY: "2500000000"}, annotations=MODE)
    assert _booked(_fit(huge, asking, None)) == [2_500_000_000]


def test_volcano_wraps_a_whole_card_beyond_int32() -> None:
    big = chip("Big", 3_000_000_000)
    family = AscendFamily(big, shuffle=_keep_order)
    whole = pod("p", [container("c0", {big.resource_name: "1"})])
    result = _fit([card("BIG-A")], whole, "volcano", family=family)
    assert _booked(result) == [3_000_000_000 - 2**32]
    assert not _fit([card("BIG-A")], whole, None, family=family).ok  # 3000000000 MiB on a 21527 MiB card


# --- the runtime annotation ----------------------------------------------------------------------


def test_runtime_json_keeps_non_ascii_and_leaves_an_empty_uuid_out() -> None:
    result = AscendFit(
        ok=True,
        devices=((Assigned("NPU-é", 0, "Ascend310P", 21527, 0), Assigned("", 1, "Ascend310P", 3072, 0)),),
    )
    runtime = FAMILY.bind_annotations(result, "node-a", NOW_NS, "volcano")["huawei.com/Ascend310P"]
    assert runtime == '[{"UUID":"NPU-é"},{"temp":"vir01"}]'  # Go writes UTF-8 and omits an empty UUID
