"""Which cards a multi-GPU request takes among those its policy rates alike: the best-linked
(docs/topology.md, "Choosing cards").

The policy decides which cards can take a request and which it prefers; the node's topology
(`fit.topology`) decides only among cards the policy rates alike. So the topology never changes
whether a pod fits, nor its score, nor its device count (a scheduler's quick screen needs no
topology); it changes which cards the bind names, and which devices GetPreferredAllocation
offers kubelet.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from deviceplugin.fit.topology import Topology, best_set


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
    picks = iter(best_set(topology, pool, count - len(kept), kept))
    return tuple(card if tier != last else next(picks) for card, tier in zip(taken, tiers, strict=False))
