"""Which cards a multi-GPU request takes among those its policy rates alike: the best-linked
(docs/topology.md, "Choosing cards").

The policy decides which cards can take a request and which it prefers; the node's topology
(`fit.topology`) decides only among cards the policy rates alike. So the topology never changes
whether a pod fits, nor its score, nor its device count (a scheduler's quick screen needs no
topology); it changes which cards the bind names, and which devices GetPreferredAllocation
offers kubelet.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Hashable, Sequence

from deviceplugin.fit.topology import EXHAUSTIVE_LIMIT, Topology, best_set


def best_with(
    topology: Topology | None, kept: Sequence[int], pool: Sequence[int], count: int
) -> tuple[int, ...]:
    """`count` GPU indices of `pool` (in the caller's order of preference) that, with the cards
    already `kept`, make the set with the best `Topology.set_score`; ties go to the first in
    `pool`'s order. Without a topology, one that leaves a card undescribed, or nothing to
    choose: the first `count` of `pool`."""
    if not kept:
        return best_set(topology, pool, count)
    chosen = tuple(pool[:count])
    if topology is None or count < 1 or count >= len(pool):
        return chosen
    if not all(topology.describes(card) for card in (*kept, *pool)):
        return chosen
    return _best_with(topology, tuple(kept), tuple(pool), count)


@functools.lru_cache(maxsize=1024)
def _best_with(
    topology: Topology, kept: tuple[int, ...], pool: tuple[int, ...], count: int
) -> tuple[int, ...]:
    """Every combination while there are few (as `best_set`), else the set grown greedily from
    `kept`, each step adding the card that scores the set best."""
    if math.comb(len(pool), count) <= EXHAUSTIVE_LIMIT:
        # combinations come in `pool` order, and max keeps the first of equal scores
        return max(itertools.combinations(pool, count), key=lambda cards: topology.set_score((*kept, *cards)))
    cards: list[int] = []
    rest = list(pool)
    while len(cards) < count:
        pick = max(rest, key=lambda card: topology.set_score((*kept, *cards, card)))
        cards.append(pick)
        rest.remove(pick)
    return tuple(sorted(cards, key=pool.index))


def linked_choice(
    topology: Topology | None, ranked: Sequence[int], tiers: Sequence[Hashable], count: int
) -> tuple[int, ...]:
    """The `count` cards a request takes of `ranked` (GPU indices of the cards that can take it,
    in the policy's order; `tiers[i]`: how the policy rates `ranked[i]`, equal for cards it rates
    alike). The policy's own choice is the first `count`; the cards of it rated like the last of
    them, with every other card rated alike, form the pool the topology chooses from; the cards
    the policy rates otherwise stay. The result lists the policy's slots in order: the kept cards
    in theirs, the pool's picks (in `ranked` order) in the others."""
    taken = ranked[:count]
    if topology is None or count < 2 or len(ranked) <= count:
        return tuple(taken)
    last = tiers[count - 1]
    kept = [card for card, tier in zip(taken, tiers, strict=False) if tier != last]
    pool = [card for card, tier in zip(ranked, tiers, strict=True) if tier == last]
    picks = iter(best_with(topology, kept, pool, count - len(kept)))
    return tuple(card if tier != last else next(picks) for card, tier in zip(taken, tiers, strict=False))
