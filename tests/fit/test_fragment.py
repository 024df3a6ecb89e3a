"""The gpu-aware score's formula (deviceplugin/fit/fragment.py): the worked examples of
docs/gpu-aware.md, figure for figure, and the rules behind them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from deviceplugin.fit.families import FAMILIES
from deviceplugin.fit.fragment import Fragment, Weights, blend, fragment, usable
from deviceplugin.fit.model import Assigned, GpuState, PodUsage
from deviceplugin.fit.topology import Link, Topology

CARD = 81920  # MiB


def islands(a: int, b: int) -> Link:
    """Two 4-card NVLink islands (GPUs 0-3 and 4-7), SYS between them."""
    return Link("NV", 4) if a // 4 == b // 4 else Link("SYS")


ISLANDS = Topology.build(range(8), [0, 0, 0, 0, 1, 1, 1, 1], islands)


def cards(busy: Sequence[int] = (), *, memory: int = 0, count: int = 8) -> list[GpuState]:
    """`count` cards, each in `busy` holding one pod with half its memory."""
    states = [GpuState(index=i, uuid=f"GPU-{i}", memory=memory) for i in range(count)]
    for index in busy:
        card = states[index]
        card.pods = {f"p{index}": PodUsage(f"p{index}", f"default/p{index}", memory=memory // 2)}
        card.used_num, card.used_memory = 1, memory // 2
    return states


def one_card(index: int, memory: int = 0, cores: int = 0) -> tuple[tuple[Assigned, ...], ...]:
    return ((Assigned(f"GPU-{index}", index, "NVIDIA", memory, cores),),)


def test_example_1_a_one_gpu_pod_on_an_empty_node_breaks_its_8_and_a_4_gpu_block() -> None:
    placed = fragment(cards(), one_card(0), ISLANDS, "whole")
    assert (placed.before, placed.after) == (8.0, 4.25)  # (8+8+8+8)/4 -> (7+6+4+0)/4
    assert placed.loss == 3.75
    assert placed.left == pytest.approx(53.125)
    assert placed.keep == pytest.approx(53.125)


def test_example_2_on_a_node_with_one_idle_island_it_breaks_that_island() -> None:
    placed = fragment(cards(busy=(4, 5, 6, 7)), one_card(0), ISLANDS, "whole")
    assert (placed.before, placed.after) == (3.0, 1.25)  # (4+4+4+0)/4 -> (3+2+0+0)/4
    assert placed.loss == 1.75
    assert placed.keep == pytest.approx(78.125)


def test_example_3_idle_halves_of_two_islands_are_no_4_gpu_block() -> None:
    placed = fragment(cards(busy=(2, 3, 6, 7)), one_card(0), ISLANDS, "whole")
    assert (placed.before, placed.after) == (2.0, 1.25)  # (4+4+0+0)/4 -> (3+2+0+0)/4
    assert placed.loss == 0.75
    assert placed.keep == pytest.approx(90.625)
    assert placed.left == pytest.approx(15.625)


def test_example_4_without_a_topology_examples_2_and_3_cost_the_same() -> None:
    island = fragment(cards(busy=(4, 5, 6, 7)), one_card(0), None, "whole")
    halves = fragment(cards(busy=(2, 3, 6, 7)), one_card(0), None, "whole")
    assert island == halves == Fragment(8, 3.0, 1.25)


def test_example_blend_of_examples_1_to_3_with_loss_weight_1() -> None:
    """Binpack (number): 100 x (1 - idle after / healthy): 12.5, 62.5, 62.5."""
    weights = Weights(weight=0, loss_weight=1)
    empty = blend(12.5, fragment(cards(), one_card(0), ISLANDS, "whole"), weights)
    island = blend(62.5, fragment(cards(busy=(4, 5, 6, 7)), one_card(0), ISLANDS, "whole"), weights)
    halves = blend(62.5, fragment(cards(busy=(2, 3, 6, 7)), one_card(0), ISLANDS, "whole"), weights)
    assert (empty, island, halves) == pytest.approx((32.8125, 70.3125, 76.5625))


def test_example_5_a_share_goes_best_on_a_card_already_in_use() -> None:
    """vgpu, 80 GiB cards, GPU 0 holds a 40 GiB pod; a 20 GiB share."""
    node = cards(busy=(0,), memory=CARD)
    shared = fragment(node, one_card(0, CARD // 4), ISLANDS, "slots")
    fresh = fragment(node, one_card(1, CARD // 4), ISLANDS, "slots")
    assert shared.before == pytest.approx(4.9)  # (7 + 6 + 4 + 0 + (7 + 0.5)) / 5
    assert shared.after == pytest.approx(4.85)  # the share class: 7 + 0.25
    assert fresh.after == pytest.approx(4.65)  # (6 + 6 + 4 + 0 + (6 + 0.5 + 0.75)) / 5
    assert shared.keep == pytest.approx(99.375)
    assert fresh.keep == pytest.approx(96.875)


def test_example_6_memory_behind_a_cards_last_slot_is_stranded() -> None:
    node = cards(busy=(0,), memory=CARD)
    node[0].used_num = 9  # of split_count 10: the share takes the last slot
    placed = fragment(node, one_card(0, CARD // 8), ISLANDS, "slots")
    assert placed.after == pytest.approx(4.8)  # the card's remaining 3/8 no longer counts
    assert placed.loss == pytest.approx(0.1)


def test_memory_behind_saturated_cores_is_stranded_but_shares_by_memory_alone_are_not() -> None:
    node = cards(busy=(0,), memory=CARD)
    cores_full = fragment(node, one_card(0, CARD // 8, cores=100), None, "slots")
    by_memory = fragment(node, one_card(0, CARD // 8, cores=100), None, "memory")
    assert cores_full.after == pytest.approx((7 + 6 + 4 + 0 + 7) / 5)
    assert by_memory.after == pytest.approx((7 + 6 + 4 + 0 + 7 + 3 / 8) / 5)


def test_whole_card_strategies_count_no_memory_on_cards_in_use() -> None:
    node = cards(busy=(0,), memory=CARD)
    assert usable(node, None, "whole") == (7 + 6 + 4 + 0) / 4


def test_unhealthy_cards_count_for_nothing() -> None:
    node = cards()
    node[7].health = False
    placed = fragment(node, one_card(0), None, "whole")
    assert placed.healthy == 7
    assert placed.before == (7 + 6 + 4 + 0) / 4


def test_a_topology_that_leaves_a_card_undescribed_is_not_used() -> None:
    partial = Topology.build(range(4), [0, 0, 0, 0], islands)
    assert usable(cards(busy=(2, 3, 6, 7)), partial, "whole") == usable(
        cards(busy=(2, 3, 6, 7)), None, "whole"
    )


def test_more_capacity_lost_never_scores_higher() -> None:
    losses = [Fragment(8, 8.0, 8.0 - lost).keep for lost in (0, 0.5, 1, 4, 8, 12)]
    assert losses == sorted(losses, reverse=True)
    assert (losses[0], losses[-1]) == (100.0, 0.0)


def test_blend_off_is_the_policys_score_itself() -> None:
    placed = fragment(cards(), one_card(0), ISLANDS, "whole")
    assert blend(37.5, placed, Weights()) == 37.5
    assert blend(20.0, placed, Weights(weight=1, loss_weight=2)) == pytest.approx(
        (20.0 + placed.left + 2 * placed.keep) / 4
    )


def test_which_strategies_share_cards() -> None:
    assert [FAMILIES[name].sharing for name in ("share", "vgpu", "number", "whole")] == [
        "memory",
        "slots",
        "whole",
        "whole",
    ]
