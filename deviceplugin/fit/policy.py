"""Schedule policies as data: what binpack, spread and no policy mean to each fit.

A fit never branches on a policy name: it looks the policy up once (`policy_of`) and calls what
the entry holds. A new policy (topology, say) is one more entry.

- `prefer(used, free)`: the fraction of a gpushare node the score rewards (binpack: the used
  share, spread: the free share; no policy: no score).
- `card_score(used_num, used_memory, memory, volcano)`: a vGPU card's score once it holds the pod.
- `card_key(card, used_num, used_memory)`: the order a vGPU fit visits cards in; None: the
  default order (highest index first; Volcano: its map order, see fit.vgpu).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from deviceplugin.fit import goint
from deviceplugin.fit.model import BINPACK, SPREAD, GpuState, check_policy


@dataclass(frozen=True, slots=True)
class Policy:
    name: str  # "" for no policy
    prefer: Callable[[float, float], float] | None
    card_score: Callable[[int, int, int, bool], float]
    card_key: Callable[[GpuState, int, int], tuple[int, int]] | None


def _binpack_card(used_num: int, used_memory: int, memory: int, volcano: bool) -> float:
    if memory == 0:
        # Go float division: x/0 is +Inf, 0/0 is NaN. The default scores an empty card 0.
        return (math.nan if used_memory == 0 else math.inf) if volcano else 0.0
    if volcano:  # float64 of Go's uint counters
        return 100.0 * (float(goint.uint64(used_memory)) / float(goint.uint64(memory)))
    return 100.0 * (used_memory / memory)


def _spread_card(used_num: int, used_memory: int, memory: int, volcano: bool) -> float:
    # A card that was idle before this pod earns the bonus. Volcano tests `UsedNum == 0` after
    # adding the pod, which never holds, so its spread score is always 0 (B3).
    return 100.0 if used_num == (0 if volcano else 1) else 0.0


def _no_card_score(used_num: int, used_memory: int, memory: int, volcano: bool) -> float:
    return 0.0


POLICIES: Mapping[str, Policy] = {
    "": Policy("", None, _no_card_score, None),
    BINPACK: Policy(
        BINPACK,
        prefer=lambda used, free: used,
        card_score=_binpack_card,
        card_key=lambda card, used_num, used_memory: (-used_memory, card.index),  # fullest first
    ),
    SPREAD: Policy(
        SPREAD,
        prefer=lambda used, free: free,
        card_score=_spread_card,
        card_key=lambda card, used_num, used_memory: (used_num, card.index),  # fewest tenants first
    ),
}


def policy_of(policy: object, volcano: bool) -> Policy:
    """The entry for a configured policy (`check_policy`'s rules: None or "" is no policy)."""
    return POLICIES[check_policy(policy, volcano)]
