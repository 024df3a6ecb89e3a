"""gpushare (`volcano.sh/gpu-memory`, `volcano.sh/gpu-number`): requests, node cards, ledger, fit, bind.

Expectations come from the shared reference ``volcano-fit-semantics.md`` (section 0 for which pods
feed the ledger, section 1 for the gpushare rules, section 8 for bugs B1, B2 and B18) and from
docs/fit.md for the places where the default mode deliberately departs from Volcano. Where both
modes agree a case runs under both `compat=None` and `compat="volcano"`.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable
from typing import Any

import pytest

from deviceplugin.fit import (
    GPUSHARE_BIND_KEYS,
    Assigned,
    Compat,
    ConfigError,
    FitResult,
    GpuIndexError,
    GpuState,
    RequestError,
    add_gpushare_pod,
    fit_gpushare,
    gpushare_bind_annotations,
    gpushare_cards,
    holds_gpus,
    parse_unhealthy_ids,
    pod_gpu_memory,
    pod_gpu_number,
    remove_gpushare_pod,
)
from deviceplugin.fit.gpushare import Strategy
from tests.fit.builders import Obj, container, gpushare_node, limits_pod, pod

MEM = "volcano.sh/gpu-memory"
NUM = "volcano.sh/gpu-number"
INDEX = "volcano.sh/gpu-index"
PREDICATE_TIME = "volcano.sh/predicate-time"

Reader = Callable[[Obj, Compat], int]

BOTH = [pytest.param(None, id="default"), pytest.param("volcano", id="volcano")]

# Two cards of 10989 MiB each: 21979 // 2 drops the remainder.
TWO_CARDS_TOTAL = 21979
PER_CARD = 10989


def mem_pod(name: str, memory: int | str, index: str | None = None, **kwargs: Any) -> Obj:
    """A one-container pod limiting `gpu-memory`, optionally already placed via `gpu-index`."""
    annotations = dict(kwargs.pop("annotations", {}))
    if index is not None:
        annotations[INDEX] = index
    return limits_pod(name, {MEM: str(memory)}, annotations=annotations, **kwargs)


def num_pod(name: str, number: int | str, index: str | None = None, **kwargs: Any) -> Obj:
    """A one-container pod limiting `gpu-number`, optionally already placed via `gpu-index`."""
    annotations = dict(kwargs.pop("annotations", {}))
    if index is not None:
        annotations[INDEX] = index
    return limits_pod(name, {NUM: str(number)}, annotations=annotations, **kwargs)


def two_cards(
    pods: list[Obj] | None = None, compat: Compat = None, unhealthy: str | None = None
) -> list[GpuState]:
    return gpushare_cards(gpushare_node(TWO_CARDS_TOTAL, 2, unhealthy), pods or [], compat)


def four_cards(
    pods: list[Obj] | None = None, compat: Compat = None, unhealthy: str | None = None
) -> list[GpuState]:
    return gpushare_cards(gpushare_node(4 * 16000, 4, unhealthy), pods or [], compat)


def chosen(result: FitResult) -> list[int]:
    """Indices of the cards a fit picked, in choice order (-1 for a device without an index)."""
    return [-1 if device.index is None else device.index for devices in result.devices for device in devices]


def idle_memory(cards: list[GpuState]) -> list[int]:
    return [card.free_memory for card in sorted(cards, key=lambda c: c.index)]


# --- 1.2 reading the pod request ------------------------------------------------------------


REQUEST_CASES = [
    pytest.param([container("main", {MEM: "1024"})], [], 1024, id="one-container"),
    pytest.param([container("main", requests={MEM: "2048"})], [], 0, id="requests-only-ignored"),
    pytest.param(
        [container("main", limits={MEM: "1024"}, requests={MEM: "4096"})],
        [],
        1024,
        id="limits-win-over-requests",
    ),
    pytest.param(
        [container("a", {MEM: "1000"}), container("b", {MEM: "2000"})], [], 3000, id="app-containers-summed"
    ),
    pytest.param(
        [container("a", {MEM: "1000"}), container("b", {MEM: "2000"})],
        [container("init", {MEM: "2500"})],
        3000,
        id="app-sum-beats-smaller-init",
    ),
    pytest.param(
        [container("a", {MEM: "1000"}), container("b", {MEM: "2000"})],
        [container("init", {MEM: "5000"})],
        5000,
        id="larger-init-wins",
    ),
    pytest.param(
        [container("a", {MEM: "100"})],
        [container("i1", {MEM: "5000"}), container("i2", {MEM: "4000"})],
        5000,
        id="init-containers-max-not-sum",
    ),
    pytest.param([], [container("init", {MEM: "700"})], 700, id="init-only"),
    pytest.param(
        [container("gpu", {MEM: "512"}), container("sidecar", {"cpu": "1"}), container("bare")],
        [container("setup", {"memory": "1Gi"})],
        512,
        id="containers-without-resource-add-nothing",
    ),
    pytest.param([container("main", {"cpu": "2"})], [], 0, id="no-gpu-resource"),
    pytest.param([], [], 0, id="no-containers"),
    pytest.param([container("main", {MEM: "1Ki"})], [], 1024, id="binary-suffix"),
    pytest.param([container("main", {MEM: "2e3"})], [], 2000, id="exponent"),
    pytest.param([container("main", {MEM: 4096})], [], 4096, id="json-number"),
]


@pytest.mark.parametrize(("containers", "inits", "expected"), REQUEST_CASES)
@pytest.mark.parametrize("compat", BOTH)
def test_pod_gpu_memory(containers: list[Obj], inits: list[Obj], expected: int, compat: Compat) -> None:
    assert pod_gpu_memory(pod("p", containers, init_containers=inits), compat) == expected


@pytest.mark.parametrize(("containers", "inits", "expected"), REQUEST_CASES)
@pytest.mark.parametrize("compat", BOTH)
def test_pod_gpu_number_reads_the_same_way(
    containers: list[Obj], inits: list[Obj], expected: int, compat: Compat
) -> None:
    def renamed(items: list[Obj]) -> list[Obj]:
        moved = copy.deepcopy(items)
        for item in moved:
            for section in item["resources"].values():
                if MEM in section:
                    section[NUM] = section.pop(MEM)
        return moved

    subject = pod("p", renamed(containers), init_containers=renamed(inits))
    assert pod_gpu_number(subject, compat) == expected
    assert pod_gpu_memory(subject, compat) == 0


def test_memory_and_number_are_read_independently() -> None:
    subject = limits_pod("p", {MEM: "3000", NUM: "2"})
    assert (pod_gpu_memory(subject), pod_gpu_number(subject)) == (3000, 2)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("1500m", 2, id="milli-rounds-up"),
        pytest.param("1.5", 2, id="decimal-rounds-up"),
        pytest.param("1001m", 2, id="just-over-one"),
        pytest.param("1000m", 1, id="exact-milli"),
    ],
)
@pytest.mark.parametrize("reader", [pod_gpu_memory, pod_gpu_number], ids=["memory", "number"])
def test_volcano_rounds_quantities_up(value: str, expected: int, reader: Reader) -> None:
    resource = MEM if reader is pod_gpu_memory else NUM
    assert reader(limits_pod("p", {resource: value}), "volcano") == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("1500m", id="milli"),
        pytest.param("1.5", id="decimal"),
        pytest.param("-1", id="negative"),
        pytest.param("-1024", id="negative-large"),
        pytest.param("lots", id="not-a-quantity"),
    ],
)
@pytest.mark.parametrize("reader", [pod_gpu_memory, pod_gpu_number], ids=["memory", "number"])
def test_default_rejects_non_whole_requests(value: str, reader: Reader) -> None:
    resource = MEM if reader is pod_gpu_memory else NUM
    subject = pod(
        "train-0",
        [container("main", {"cpu": "1"}), container("worker", {resource: value})],
        namespace="ml",
    )
    with pytest.raises(RequestError) as caught:
        reader(subject, None)
    message = str(caught.value)
    assert "ml/train-0" in message
    assert "worker" in message


def test_default_rejects_bad_init_container_request() -> None:
    subject = pod("p", [container("main", {MEM: "10"})], init_containers=[container("prep", {MEM: "0.5"})])
    with pytest.raises(RequestError, match="prep"):
        pod_gpu_memory(subject)


def test_unknown_compat_value_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        pod_gpu_memory(mem_pod("p", 1), "kubernetes")  # type: ignore[arg-type]


# --- 1.1 node model ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "number", "per_card"),
    [
        pytest.param(21979, 2, [10989, 10989], id="remainder-dropped"),
        pytest.param(21978, 2, [10989, 10989], id="even-split"),
        pytest.param(32768, 1, [32768], id="single-card"),
        pytest.param(10, 4, [2, 2, 2, 2], id="tiny-remainder"),
    ],
)
@pytest.mark.parametrize("compat", BOTH)
def test_memory_is_split_evenly_over_cards(
    total: int, number: int, per_card: list[int], compat: Compat
) -> None:
    cards = gpushare_cards(gpushare_node(total, number), [], compat)
    assert [card.index for card in cards] == list(range(number))
    assert [card.memory for card in cards] == per_card
    assert all(card.health and card.used_memory == 0 and not card.pods for card in cards)


def _without(node: Obj, resource: str) -> Obj:
    del node["status"]["capacity"][resource]
    return node


@pytest.mark.parametrize(
    "node",
    [
        pytest.param(gpushare_node(0, 0), id="number-zero"),
        pytest.param(gpushare_node(16000, 0), id="memory-but-number-zero"),
        pytest.param(_without(gpushare_node(16000, 2), MEM), id="no-memory-capacity"),
        pytest.param(_without(gpushare_node(16000, 2), NUM), id="no-number-capacity"),
        pytest.param(
            {"metadata": {"name": "cpu-only"}, "status": {"capacity": {"cpu": "8"}}}, id="plain-node"
        ),
        pytest.param({"metadata": {"name": "bare"}}, id="no-status"),
    ],
)
@pytest.mark.parametrize("compat", BOTH)
def test_node_without_gpushare_capacity_has_no_cards(node: Obj, compat: Compat) -> None:
    assert gpushare_cards(node, [], compat) == []


@pytest.mark.parametrize("compat", BOTH)
def test_capacity_not_allocatable_defines_the_cards(compat: Compat) -> None:
    node = gpushare_node(TWO_CARDS_TOTAL, 2)
    node["status"]["allocatable"] = {MEM: "1000", NUM: "1"}
    cards = gpushare_cards(node, [], compat)
    assert [card.memory for card in cards] == [PER_CARD, PER_CARD]


@pytest.mark.parametrize("compat", BOTH)
def test_unhealthy_card_is_marked_and_never_chosen(compat: Compat) -> None:
    cards = two_cards([mem_pod("filler", 10000, "0")], compat, unhealthy="1")
    assert [card.health for card in cards] == [True, False]
    # Card 0 has only 989 MiB left; card 1 is empty but unhealthy.
    result = fit_gpushare(cards, mem_pod("next", 1024), compat=compat)
    assert not result.ok
    assert fit_gpushare(cards, mem_pod("small", 900), compat=compat).devices[0][0].index == 0


@pytest.mark.parametrize(
    ("value", "volcano", "default"),
    [
        pytest.param("", set(), set(), id="empty"),
        pytest.param("1", {1}, {1}, id="one"),
        pytest.param("0,2", {0, 2}, {0, 2}, id="two"),
        pytest.param("1,x", {1}, GpuIndexError, id="bad-item"),
        pytest.param("x", set(), GpuIndexError, id="only-bad-item"),
        pytest.param("1,,2", {1, 2}, GpuIndexError, id="empty-item"),
        pytest.param("1, 2", {1}, {1, 2}, id="space-before-item"),
    ],
)
def test_parse_unhealthy_ids(value: str, volcano: set[int], default: set[int] | type[Exception]) -> None:
    assert parse_unhealthy_ids(value, "volcano") == frozenset(volcano)
    if isinstance(default, set):
        assert parse_unhealthy_ids(value) == frozenset(default)
    else:
        with pytest.raises(default):
            parse_unhealthy_ids(value)


def test_unreadable_unhealthy_ids_on_node() -> None:
    node = gpushare_node(4 * 16000, 4, unhealthy="2,two")
    assert [card.health for card in gpushare_cards(node, [], "volcano")] == [True, True, False, True]
    with pytest.raises(GpuIndexError):
        gpushare_cards(node)


# --- section 0 / 1.3: which pods hold cards, and the ledger --------------------------------


@pytest.mark.parametrize(
    ("phase", "deleting", "default", "volcano"),
    [
        pytest.param("Running", False, True, True, id="running"),
        pytest.param("Pending", False, True, True, id="pending"),
        pytest.param("Unknown", False, True, True, id="unknown"),
        pytest.param("", False, True, True, id="no-phase"),
        pytest.param("Succeeded", False, False, False, id="succeeded"),
        pytest.param("Failed", False, False, False, id="failed"),
        # Volcano: Running/Pending with a deletionTimestamp is Releasing, which books nothing.
        pytest.param("Running", True, True, False, id="terminating-running"),
        pytest.param("Pending", True, True, False, id="terminating-pending"),
        # getTaskStatus maps Unknown and any other phase to Unknown, which stays booked.
        pytest.param("Unknown", True, True, True, id="terminating-unknown"),
        pytest.param("", True, True, True, id="terminating-no-phase"),
        pytest.param("Succeeded", True, False, False, id="succeeded-and-deleted"),
    ],
)
def test_holds_gpus(phase: str, deleting: bool, default: bool, volcano: bool) -> None:
    subject = mem_pod("p", 1024, "0", phase=phase, deleting=deleting)
    assert holds_gpus(subject) is default
    assert holds_gpus(subject, "volcano") is volcano


@pytest.mark.parametrize(
    ("index", "booked"),
    [
        pytest.param("1", [0, 1024, 0, 0], id="one-card"),
        pytest.param("0,2", [1024, 0, 1024, 0], id="two-cards"),
        pytest.param("3,0", [1024, 0, 0, 1024], id="any-order"),
        pytest.param("7", [0, 0, 0, 0], id="card-not-on-node"),
        pytest.param("1,7", [0, 1024, 0, 0], id="only-existing-cards"),
    ],
)
@pytest.mark.parametrize("compat", BOTH)
def test_pod_books_the_cards_its_gpu_index_names(index: str, booked: list[int], compat: Compat) -> None:
    cards = four_cards([mem_pod("placed", 1024, index)], compat)
    assert [card.used_memory for card in cards] == booked
    assert [("uid-placed" in card.pods) for card in cards] == [amount > 0 for amount in booked]
    assert [card.used_num for card in cards] == [1 if amount else 0 for amount in booked]


@pytest.mark.parametrize(
    "subject",
    [
        pytest.param(mem_pod("unplaced", 1024), id="no-gpu-index"),
        pytest.param(limits_pod("cpu", {"cpu": "1"}, annotations={INDEX: "0"}), id="no-gpushare-request"),
        pytest.param(limits_pod("zero", {MEM: "0"}, annotations={INDEX: "0"}), id="zero-request"),
    ],
)
@pytest.mark.parametrize("compat", BOTH)
def test_pod_that_holds_nothing(subject: Obj, compat: Compat) -> None:
    cards = two_cards([subject], compat)
    assert all(not card.pods and card.used_memory == 0 and card.used_num == 0 for card in cards)


@pytest.mark.parametrize("compat", BOTH)
def test_gpu_number_pod_makes_its_cards_busy(compat: Compat) -> None:
    cards = four_cards([num_pod("whole", 2, "1,3")], compat)
    assert [bool(card.pods) for card in cards] == [False, True, False, True]
    assert [card.used_memory for card in cards] == [0, 0, 0, 0]


@pytest.mark.parametrize(
    "index",
    [
        pytest.param("0,x", id="letter"),
        pytest.param("0,", id="trailing-comma"),
        pytest.param("", id="empty"),
        pytest.param("0;1", id="semicolon"),
    ],
)
def test_unreadable_gpu_index(index: str) -> None:
    placed = mem_pod("odd", 1024, index)
    cards = two_cards([placed], "volcano")
    assert all(not card.pods for card in cards), "Volcano ignores the whole annotation"
    with pytest.raises(GpuIndexError):
        two_cards([placed])


@pytest.mark.parametrize("compat", BOTH)
def test_over_subscribed_card_has_zero_idle_memory(compat: Compat) -> None:
    # B2: two pods of 8000 MiB pinned to one 10989 MiB card; idle memory clamps at 0.
    cards = two_cards([mem_pod("a", 8000, "0"), mem_pod("b", 8000, "0")], compat)
    assert cards[0].used_memory == 16000
    assert idle_memory(cards) == [0, PER_CARD]
    result = fit_gpushare(cards, mem_pod("tiny", 1), compat=compat)
    assert chosen(result) == [1]


@pytest.mark.parametrize("compat", BOTH)
def test_adding_a_pod_twice_counts_it_once(compat: Compat) -> None:
    cards = two_cards(compat=compat)
    placed = mem_pod("p", 2048, "0")
    add_gpushare_pod(cards, placed, compat)
    add_gpushare_pod(cards, placed, compat)
    assert (cards[0].used_memory, cards[0].used_num, list(cards[0].pods)) == (2048, 1, ["uid-p"])


@pytest.mark.parametrize("compat", BOTH)
def test_adding_again_after_the_index_changed_moves_the_pod(compat: Compat) -> None:
    cards = two_cards(compat=compat)
    add_gpushare_pod(cards, mem_pod("p", 2048, "0"), compat)
    add_gpushare_pod(cards, mem_pod("p", 2048, "1"), compat)
    assert [card.used_memory for card in cards] == [0, 2048]
    assert [card.used_num for card in cards] == [0, 1]


@pytest.mark.parametrize("compat", BOTH)
def test_remove_frees_the_cards(compat: Compat) -> None:
    cards = four_cards([mem_pod("keep", 500, "0"), mem_pod("gone", 1024, "0,2")], compat)
    remove_gpushare_pod(cards, "uid-gone")
    assert [card.used_memory for card in cards] == [500, 0, 0, 0]
    assert [sorted(card.pods) for card in cards] == [["uid-keep"], [], [], []]
    assert [card.used_num for card in cards] == [1, 0, 0, 0]
    remove_gpushare_pod(cards, "uid-never-added")
    assert [card.used_memory for card in cards] == [500, 0, 0, 0]
    # Idle cards share one empty map of pods: a card emptied and booked again shows on no other.
    add_gpushare_pod(cards, mem_pod("next", 256, "2"), compat)
    assert [sorted(card.pods) for card in cards] == [["uid-keep"], [], ["uid-next"], []]
    assert [card.used_memory for card in cards] == [500, 0, 256, 0]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pod_default_holds_nothing(phase: str) -> None:
    cards = two_cards([mem_pod("done", 8000, "0", phase=phase), num_pod("done-n", 1, "1", phase=phase)])
    assert all(not card.pods and card.used_memory == 0 for card in cards)
    assert chosen(fit_gpushare(cards, num_pod("wide", 2), strategy="number")) == [0, 1]


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pod_volcano_cache_books_nothing(phase: str) -> None:
    # Volcano's cache never adds a finished pod (addTask/isTerminated): a lingering finished Job
    # pod leaves its card idle, so a whole-card request still fits there.
    cards = two_cards(
        [mem_pod("done", 8000, "0", phase=phase), num_pod("done-n", 1, "1", phase=phase)], "volcano"
    )
    assert all(not card.pods and card.used_memory == 0 for card in cards)
    assert chosen(fit_gpushare(cards, mem_pod("big", PER_CARD), compat="volcano")) == [0]
    assert fit_gpushare(cards, num_pod("wide", 2), strategy="number", compat="volcano").ok


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pod_added_directly_volcano_stays_on_card_without_memory(phase: str) -> None:
    # GPUDevices.AddResource itself books any pod; getUsedGPUMemory then skips finished ones, but
    # "idle" means an empty PodMap.
    cards = two_cards([], "volcano")
    add_gpushare_pod(cards, mem_pod("done", 8000, "0", phase=phase), "volcano")
    assert list(cards[0].pods) == ["uid-done"]
    assert idle_memory(cards) == [PER_CARD, PER_CARD]
    assert chosen(fit_gpushare(cards, mem_pod("big", 10000), compat="volcano")) == [0]
    number = fit_gpushare(cards, num_pod("wide", 2), strategy="number", compat="volcano")
    assert not number.ok
    remove_gpushare_pod(cards, "uid-done")
    assert (cards[0].used_memory, cards[0].used_num, cards[0].pods) == (0, 0, {})


@pytest.mark.parametrize(
    ("compat", "idle"),
    [
        pytest.param(None, [PER_CARD - 10000, PER_CARD], id="default-counts-it"),
        pytest.param("volcano", [PER_CARD, PER_CARD], id="volcano-leaves-it-out"),
    ],
)
def test_terminating_pod(compat: Compat, idle: list[int]) -> None:
    # B18: a pod being deleted still runs its containers; Volcano drops it from the ledger anyway.
    cards = two_cards([mem_pod("leaving", 10000, "0", deleting=True)], compat)
    assert idle_memory(cards) == idle
    expected = 1 if compat is None else 0
    assert chosen(fit_gpushare(cards, mem_pod("next", 2048), compat=compat)) == [expected]


# --- 1.4 predicate: memory -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("booked", "need", "card"),
    [
        pytest.param([], 1024, 0, id="empty-node-card-0"),
        pytest.param([mem_pod("a", 8000, "0")], 2000, 0, id="first-fit-not-emptiest"),
        pytest.param([mem_pod("a", 8000, "0")], 2989, 0, id="exactly-the-idle-memory"),
        pytest.param([mem_pod("a", 8000, "0")], 2990, 1, id="one-over-goes-next"),
        pytest.param([mem_pod("a", 10989, "0")], 1, 1, id="full-card-skipped"),
        pytest.param([], PER_CARD, 0, id="whole-card"),
    ],
)
@pytest.mark.parametrize("compat", BOTH)
def test_memory_goes_to_lowest_index_card_with_room(
    booked: list[Obj], need: int, card: int, compat: Compat
) -> None:
    result = fit_gpushare(two_cards(booked, compat), mem_pod("new", need), compat=compat)
    assert result.ok
    assert len(result.devices) == 1 and len(result.devices[0]) == 1
    device = result.devices[0][0]
    assert (device.index, device.memory) == (card, need)


@pytest.mark.parametrize("compat", BOTH)
def test_card_order_is_by_index_not_by_list_position(compat: Compat) -> None:
    cards = four_cards([mem_pod("a", 15000, "0")], compat)
    result = fit_gpushare(list(reversed(cards)), mem_pod("new", 4000), compat=compat)
    assert chosen(result) == [1]
    assert result.devices[0][0].uuid == cards[1].uuid


@pytest.mark.parametrize("compat", BOTH)
def test_whole_pod_must_fit_on_one_card(compat: Compat) -> None:
    subject = pod("split", [container("a", {MEM: "6000"}), container("b", {MEM: "6000"})])
    cards = two_cards(compat=compat)
    assert sum(card.free_memory for card in cards) >= 12000
    result = fit_gpushare(cards, subject, compat=compat)
    assert not result.ok
    assert result.devices == ()


@pytest.mark.parametrize("compat", BOTH)
def test_init_container_request_must_fit_on_one_card(compat: Compat) -> None:
    subject = pod(
        "warm", [container("main", {MEM: "1000"})], init_containers=[container("load", {MEM: "11000"})]
    )
    assert not fit_gpushare(two_cards(compat=compat), subject, compat=compat).ok


@pytest.mark.parametrize("compat", BOTH)
def test_memory_failure_reason_names_pod_request_and_cards(compat: Compat) -> None:
    cards = two_cards([mem_pod("filler", 10000, "0")], compat, unhealthy="1")
    result = fit_gpushare(cards, mem_pod("big", 2048, namespace="ml"), compat=compat)
    assert not result.ok
    assert "ml/big" in result.reason
    assert "2048" in result.reason
    assert re.search(r"GPU 0\b[^;\]]*\b989\b", result.reason), result.reason
    assert re.search(r"GPU 1\b[^;\]]*unhealthy", result.reason), result.reason


@pytest.mark.parametrize("compat", BOTH)
def test_memory_fit_on_node_without_cards_fails(compat: Compat) -> None:
    result = fit_gpushare([], mem_pod("p", 1), compat=compat)
    assert not result.ok
    assert "default/p" in result.reason


@pytest.mark.parametrize(
    "subject",
    [
        pytest.param(limits_pod("cpu", {"cpu": "1"}), id="no-gpu"),
        pytest.param(limits_pod("zero", {MEM: "0"}), id="zero-memory"),
        pytest.param(num_pod("number-only", 2), id="number-request-under-share"),
    ],
)
@pytest.mark.parametrize("compat", BOTH)
def test_share_without_memory_request_fits_with_no_devices(subject: Obj, compat: Compat) -> None:
    full = two_cards([mem_pod("a", PER_CARD, "0"), mem_pod("b", PER_CARD, "1")], compat)
    result = fit_gpushare(full, subject, compat=compat, policy="binpack")
    assert result == FitResult(ok=True)


@pytest.mark.parametrize("strategy", ["share", "number"])
@pytest.mark.parametrize("compat", BOTH)
def test_fit_does_not_change_the_cards(strategy: Strategy, compat: Compat) -> None:
    cards = four_cards([mem_pod("a", 3000, "0"), num_pod("n", 1, "2")], compat)
    before = copy.deepcopy(cards)
    subject = mem_pod("new", 1000) if strategy == "share" else num_pod("new", 2)
    assert fit_gpushare(cards, subject, strategy=strategy, compat=compat, rng=random.Random(1)).ok
    assert cards == before


@pytest.mark.parametrize("compat", BOTH)
def test_unknown_strategy_is_rejected(compat: Compat) -> None:
    with pytest.raises(RequestError):
        fit_gpushare(two_cards(compat=compat), mem_pod("p", 1), strategy="bogus", compat=compat)  # type: ignore[arg-type]


# --- 1.4 predicate: gpu-number -------------------------------------------------------------


@pytest.mark.parametrize(
    ("booked", "unhealthy", "need", "expected"),
    [
        pytest.param([], None, 1, [0], id="first-card"),
        pytest.param([], None, 4, [0, 1, 2, 3], id="all-cards"),
        pytest.param([mem_pod("a", 1, "0")], None, 2, [1, 2], id="skips-card-with-memory-pod"),
        pytest.param([num_pod("a", 2, "1,2")], None, 2, [0, 3], id="skips-busy-cards"),
        pytest.param([], "0,2", 2, [1, 3], id="skips-unhealthy"),
        pytest.param([mem_pod("a", 1, "3")], "1", 2, [0, 2], id="busy-and-unhealthy"),
    ],
)
def test_default_number_takes_lowest_idle_indices(
    booked: list[Obj], unhealthy: str | None, need: int, expected: list[int]
) -> None:
    # B1 fix: the default takes idle cards in ascending index order.
    result = fit_gpushare(four_cards(booked, unhealthy=unhealthy), num_pod("wide", need), strategy="number")
    assert result.ok
    assert chosen(result) == expected
    assert len(result.devices) == 1
    assert [device.memory for device in result.devices[0]] == [16000] * need


@pytest.mark.parametrize(
    ("booked", "unhealthy", "need"),
    [
        pytest.param([], None, 5, id="more-than-cards"),
        pytest.param([mem_pod("a", 1, "0")], None, 4, id="one-busy"),
        pytest.param([], "3", 4, id="one-unhealthy"),
        pytest.param([num_pod("a", 2, "0,1"), mem_pod("b", 1, "2")], None, 2, id="only-one-idle"),
    ],
)
@pytest.mark.parametrize("compat", BOTH)
def test_number_fails_with_too_few_idle_cards(
    booked: list[Obj], unhealthy: str | None, need: int, compat: Compat
) -> None:
    cards = four_cards(booked, compat, unhealthy=unhealthy)
    result = fit_gpushare(cards, num_pod("wide", need, namespace="ml"), strategy="number", compat=compat)
    assert not result.ok
    assert result.devices == ()
    assert "ml/wide" in result.reason
    assert re.search(rf"\b{need}\b", result.reason), result.reason
    assert "idle" in result.reason


@pytest.mark.parametrize(
    "subject",
    [
        pytest.param(limits_pod("cpu", {"cpu": "1"}), id="no-gpu"),
        pytest.param(mem_pod("m", 100), id="memory-only"),
    ],
)
@pytest.mark.parametrize("compat", BOTH)
def test_number_without_request_fits_with_no_devices(subject: Obj, compat: Compat) -> None:
    result = fit_gpushare([], subject, strategy="number", compat=compat)
    assert result == FitResult(ok=True)


def test_volcano_number_picks_distinct_idle_healthy_cards_at_random() -> None:
    # B1: Volcano walks a Go map, so which idle cards it takes is unspecified; compat draws them.
    node = gpushare_node(8 * 1000, 8, unhealthy="5")
    cards = gpushare_cards(node, [mem_pod("a", 10, "0"), num_pod("b", 1, "3")], "volcano")
    allowed = {1, 2, 4, 6, 7}
    seen: set[tuple[int, ...]] = set()
    for seed in range(60):
        result = fit_gpushare(
            cards, num_pod("wide", 3), strategy="number", compat="volcano", rng=random.Random(seed)
        )
        assert result.ok
        picked = chosen(result)
        assert len(picked) == 3
        assert len(set(picked)) == 3
        assert set(picked) <= allowed
        seen.add(tuple(picked))
    assert len(seen) > 1


def test_volcano_number_is_reproducible_for_a_seed() -> None:
    cards = four_cards(compat="volcano")
    picks = [
        chosen(
            fit_gpushare(cards, num_pod("w", 2), strategy="number", compat="volcano", rng=random.Random(7))
        )
        for _ in range(3)
    ]
    assert picks[0] == picks[1] == picks[2]


def test_volcano_number_without_rng_still_picks_valid_cards() -> None:
    cards = four_cards([mem_pod("a", 1, "2")], "volcano")
    picked = chosen(fit_gpushare(cards, num_pod("w", 3), strategy="number", compat="volcano"))
    assert sorted(picked) == [0, 1, 3]


# --- 1.6 scores ----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [None, "", "binpack", "spread", "foo"])
@pytest.mark.parametrize("strategy", ["share", "number"])
def test_volcano_scores_are_always_zero(policy: str | None, strategy: Strategy) -> None:
    cards = four_cards([mem_pod("a", 4000, "0")], "volcano")
    subject = mem_pod("p", 4000) if strategy == "share" else num_pod("p", 2)
    result = fit_gpushare(
        cards, subject, strategy=strategy, policy=policy, compat="volcano", rng=random.Random(0)
    )
    assert result.ok
    assert result.score == 0.0


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        pytest.param(None, 0.0, id="unset"),
        pytest.param("", 0.0, id="empty"),
        # Chosen card 0 of 16000 MiB: 4000 booked + 4000 requested = half in use.
        pytest.param("binpack", 50.0, id="binpack-used-fraction"),
        pytest.param("spread", 50.0, id="spread-free-fraction"),
    ],
)
def test_default_share_score_half_used(policy: str | None, expected: float) -> None:
    result = fit_gpushare(four_cards([mem_pod("a", 4000, "0")]), mem_pod("p", 4000), policy=policy)
    assert chosen(result) == [0]
    assert result.score == pytest.approx(expected)


@pytest.mark.parametrize(
    ("booked", "need", "binpack"),
    [
        pytest.param([], 4000, 25.0, id="quarter"),
        pytest.param([mem_pod("a", 12000, "0")], 4000, 100.0, id="fills-card"),
        pytest.param([mem_pod("a", 10000, "0")], 2000, 75.0, id="three-quarters"),
    ],
)
def test_default_share_binpack_and_spread_are_complementary(
    booked: list[Obj], need: int, binpack: float
) -> None:
    cards = four_cards(booked)
    packed = fit_gpushare(cards, mem_pod("p", need), policy="binpack")
    spread = fit_gpushare(cards, mem_pod("p", need), policy="spread")
    assert packed.score == pytest.approx(binpack)
    assert spread.score == pytest.approx(100.0 - binpack)


def test_default_binpack_prefers_the_fuller_node() -> None:
    emptier = four_cards([])
    fuller = four_cards([mem_pod("a", 8000, "0")])
    subject = mem_pod("p", 2000)
    assert (
        fit_gpushare(fuller, subject, policy="binpack").score
        > fit_gpushare(emptier, subject, policy="binpack").score
    )
    assert (
        fit_gpushare(fuller, subject, policy="spread").score
        < fit_gpushare(emptier, subject, policy="spread").score
    )


@pytest.mark.parametrize(
    ("booked", "unhealthy", "need", "spread"),
    [
        # 4 healthy cards, none busy, take 1: 3 of 4 idle afterwards.
        pytest.param([], None, 1, 75.0, id="one-of-four"),
        pytest.param([mem_pod("a", 1, "0")], None, 1, 50.0, id="one-busy-take-one"),
        pytest.param([], None, 4, 0.0, id="take-all"),
        # Card 3 unhealthy: 3 healthy cards; card 0 busy, take 1 -> 1 of 3 idle after.
        pytest.param([mem_pod("a", 1, "0")], "3", 1, 100.0 / 3, id="unhealthy-not-counted"),
    ],
)
def test_default_number_scores(booked: list[Obj], unhealthy: str | None, need: int, spread: float) -> None:
    cards = four_cards(booked, unhealthy=unhealthy)
    subject = num_pod("wide", need)
    assert fit_gpushare(cards, subject, strategy="number", policy="spread").score == pytest.approx(spread)
    assert fit_gpushare(cards, subject, strategy="number", policy="binpack").score == pytest.approx(
        100.0 - spread
    )
    assert fit_gpushare(cards, subject, strategy="number").score == 0.0


@pytest.mark.parametrize("policy", ["foo", "Binpack", "least-allocated"])
@pytest.mark.parametrize("strategy", ["share", "number"])
def test_unknown_policy(policy: str, strategy: Strategy) -> None:
    cards = four_cards()
    subject = mem_pod("p", 100) if strategy == "share" else num_pod("p", 1)
    with pytest.raises(ConfigError):
        fit_gpushare(cards, subject, strategy=strategy, policy=policy)
    # Volcano treats any other string as unset.
    result = fit_gpushare(
        cards, subject, strategy=strategy, policy=policy, compat="volcano", rng=random.Random(0)
    )
    assert result.ok
    assert result.score == 0.0


# --- 1.5 annotations, and the seed walk-through --------------------------------------------


@pytest.mark.parametrize(
    ("indices", "now_ns", "gpu_index", "predicate_time"),
    [
        pytest.param([1], 1763719200123456789, "1", "1763719200123456789", id="one-card"),
        pytest.param([0, 2, 3], 5, "0,2,3", "5", id="ascending"),
        pytest.param([3, 0, 2], 1700000000000000000, "3,0,2", "1700000000000000000", id="choice-order-kept"),
    ],
)
def test_gpushare_bind_annotations(
    indices: list[int], now_ns: int, gpu_index: str, predicate_time: str
) -> None:
    devices = tuple(Assigned(f"node-a-gpu-{i}", i, "NVIDIA", 1000, 0) for i in indices)
    result = FitResult(ok=True, devices=(devices,))
    assert gpushare_bind_annotations(result, now_ns) == {INDEX: gpu_index, PREDICATE_TIME: predicate_time}
    assert set(GPUSHARE_BIND_KEYS) == {INDEX, PREDICATE_TIME}  # what a Release drops


def test_bind_annotations_follow_the_volcano_draw_order() -> None:
    cards = gpushare_cards(gpushare_node(8 * 1000, 8), [], "volcano")
    result = fit_gpushare(cards, num_pod("w", 4), strategy="number", compat="volcano", rng=random.Random(3))
    notes = gpushare_bind_annotations(result, 42)
    assert notes[INDEX] == ",".join(str(i) for i in chosen(result))
    assert notes[PREDICATE_TIME] == "42"


def _bind(subject: Obj, result: FitResult, now_ns: int) -> Obj:
    """What the API server does with the Binding's annotations: merge them into the pod."""
    bound = copy.deepcopy(subject)
    bound["metadata"]["annotations"].update(gpushare_bind_annotations(result, now_ns))
    return bound


@pytest.mark.parametrize("compat", BOTH)
def test_seed_two_small_pods_share_gpu_0(compat: Compat) -> None:
    cards = gpushare_cards(gpushare_node(TWO_CARDS_TOTAL, 2), [], compat)
    assert [card.memory for card in cards] == [PER_CARD, PER_CARD]

    first = mem_pod("first", 1024)
    placed = fit_gpushare(cards, first, compat=compat)
    assert placed.ok and chosen(placed) == [0]
    bound = _bind(first, placed, 1_000)
    assert bound["metadata"]["annotations"][INDEX] == "0"
    add_gpushare_pod(cards, bound, compat)
    assert idle_memory(cards) == [PER_CARD - 1024, PER_CARD]

    second = mem_pod("second", 1024)
    placed_second = fit_gpushare(cards, second, compat=compat)
    assert chosen(placed_second) == [0]
    add_gpushare_pod(cards, _bind(second, placed_second, 2_000), compat)
    assert idle_memory(cards) == [PER_CARD - 2048, PER_CARD]
    assert sorted(cards[0].pods) == ["uid-first", "uid-second"]


@pytest.mark.parametrize("compat", BOTH)
def test_seed_pinned_pod_occupies_the_named_card(compat: Compat) -> None:
    pinned = mem_pod("pinned", 10000, "0")
    cards = gpushare_cards(gpushare_node(TWO_CARDS_TOTAL, 2), [pinned], compat)
    assert idle_memory(cards) == [989, PER_CARD]
    assert list(cards[0].pods) == ["uid-pinned"] and not cards[1].pods
    # The next 1024 MiB pod no longer fits on card 0.
    assert chosen(fit_gpushare(cards, mem_pod("next", 1024), compat=compat)) == [1]
    # A small one still takes card 0 first.
    assert chosen(fit_gpushare(cards, mem_pod("small", 989), compat=compat)) == [0]


@pytest.mark.parametrize("compat", BOTH)
def test_seed_pinned_number_pod_is_seen_by_later_fits(compat: Compat) -> None:
    cards = four_cards([num_pod("pinned", 2, "0,2")], compat)
    assert [bool(card.pods) for card in cards] == [True, False, True, False]
    result = fit_gpushare(cards, num_pod("next", 2), strategy="number", compat=compat, rng=random.Random(0))
    assert sorted(chosen(result)) == [1, 3]
    assert not fit_gpushare(cards, num_pod("big", 3), strategy="number", compat=compat).ok
    # Memory pods may still share the cards the number pod holds.
    assert chosen(fit_gpushare(cards, mem_pod("shared", 1024), compat=compat)) == [0]


def test_default_number_then_book_then_fit_again() -> None:
    cards = four_cards()
    first = num_pod("first", 2)
    placed = fit_gpushare(cards, first, strategy="number")
    assert chosen(placed) == [0, 1]
    add_gpushare_pod(cards, _bind(first, placed, 10))
    second = fit_gpushare(cards, num_pod("second", 2), strategy="number")
    assert chosen(second) == [2, 3]
    add_gpushare_pod(cards, _bind(num_pod("second", 2), second, 11))
    assert not fit_gpushare(cards, num_pod("third", 1), strategy="number").ok
    remove_gpushare_pod(cards, "uid-first")
    assert chosen(fit_gpushare(cards, num_pod("third", 1), strategy="number")) == [0]
