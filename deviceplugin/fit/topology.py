"""GPU interconnect inside a node, and the card set a multi-GPU request gets (docs/topology.md).

A node's daemon describes each pair of its GPUs by the closest path between them, in the classes
`nvidia-smi topo -m` prints, best first: `NV<n>` (n NVLinks), `PIX` (one PCIe switch), `PXB`
(several PCIe switches, no host bridge), `PHB` (one PCIe host bridge), `NODE` (host bridges of
one NUMA node), `SYS` (across NUMA nodes / sockets); and each GPU's NUMA node. It publishes them
in the node annotation `volcano.sh/gpu-topology` (`TOPOLOGY_KEY`) as compact JSON:

    {"gpus":[0,1,2,3],"numa":[0,0,1,1],"links":["NV4","PIX","SYS","SYS","PIX","NV4"]}

`gpus` are GPU indices (as `volcano.sh/gpu-index` and the registration name them), `numa` the
NUMA node of each (-1: unknown), `links` the upper triangle of the pair matrix row by row:
(g0,g1), (g0,g2), ..., (g0,gn), (g1,g2), ...

Choosing cards: a card set scores (worst pair rank, sum of pair ranks), compared in that order
(`set_score`): the slowest link bounds a collective, the sum prefers more NVLinks among the rest.
`best_set` searches every combination while there are few (`EXHAUSTIVE_LIMIT`), else grows a set
greedily from each card; ties keep the caller's preference order, so without a topology, or with
one that rates every set alike, the choice is the caller's own first cards.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deviceplugin.fit import jsontext, objects
from deviceplugin.fit.errors import AnnotationError

TOPOLOGY_KEY = "volcano.sh/gpu-topology"

# The PCIe / system classes, worst first; their rank is their position + 1. NVLink ranks above
# them all, one step per link (`Link.rank`).
PCIE_CLASSES = ("SYS", "NODE", "PHB", "PXB", "PIX")
NVLINK = "NV"
_NVLINK_BASE = 10  # NV<n> ranks 10 + n: one NVLink beats any PCIe path
MAX_NVLINKS = 18  # NVLink 4 on H100/H200: 18 links per GPU
UNKNOWN_NUMA = -1
# Above this many combinations `best_set` grows sets greedily (8 of 16 cards: 12,870).
EXHAUSTIVE_LIMIT = 2_000


@dataclass(frozen=True, slots=True)
class Link:
    """The closest path between two GPUs."""

    kind: str  # one of PCIE_CLASSES, or NVLINK
    lanes: int = 0  # NVLinks between the two, for NVLINK

    @property
    def rank(self) -> int:
        """Higher is faster: SYS 1 ... PIX 5, NV<n> 10 + n."""
        if self.kind == NVLINK:
            return _NVLINK_BASE + self.lanes
        return PCIE_CLASSES.index(self.kind) + 1

    def __str__(self) -> str:
        return f"{NVLINK}{self.lanes}" if self.kind == NVLINK else self.kind


def parse_link(text: str) -> Link:
    """`NV<n>` (1 <= n <= MAX_NVLINKS) or a PCIe class; ValueError naming what is accepted."""
    if text in PCIE_CLASSES:
        return Link(text)
    lanes = text[len(NVLINK) :]
    if text.startswith(NVLINK) and lanes.isdigit() and lanes.isascii() and 1 <= int(lanes) <= MAX_NVLINKS:
        return Link(NVLINK, int(lanes))
    raise ValueError(f"link {text!r} is none of NV1..NV{MAX_NVLINKS}, {', '.join(reversed(PCIE_CLASSES))}")


@dataclass(frozen=True, slots=True)
class Topology:
    """Pairwise links and NUMA nodes of a node's GPUs, by GPU index."""

    gpus: tuple[int, ...]
    numa: tuple[int, ...]
    links: tuple[Link, ...]  # upper triangle, row by row, in the order of `gpus`
    _position: Mapping[int, int] = field(init=False, repr=False, compare=False, hash=False)
    _ranks: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False, hash=False)
    _hash: int = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        count = len(self.gpus)
        if len(set(self.gpus)) != count:
            raise ValueError(f"GPU indices repeat: {list(self.gpus)}")
        if len(self.numa) != count:
            raise ValueError(f"{len(self.numa)} NUMA nodes for {count} GPUs")
        pairs = count * (count - 1) // 2
        if len(self.links) != pairs:
            raise ValueError(f"{len(self.links)} links for {count} GPUs: the upper triangle holds {pairs}")
        ranks = [[0] * count for _ in range(count)]
        for (a, b), link in zip(itertools.combinations(range(count), 2), self.links, strict=True):
            ranks[a][b] = ranks[b][a] = link.rank
        object.__setattr__(self, "_position", {gpu: pos for pos, gpu in enumerate(self.gpus)})
        object.__setattr__(self, "_ranks", tuple(map(tuple, ranks)))
        object.__setattr__(self, "_hash", hash((self.gpus, self.numa, self.links)))

    def __hash__(self) -> int:
        """Computed once: the choice caches look a node's topology up on every multi-GPU fit,
        and hashing walks every link (28 for 8 GPUs, 120 for 16)."""
        return self._hash

    @classmethod
    def build(cls, gpus: Sequence[int], numa: Sequence[int], link: Callable[[int, int], Link]) -> Topology:
        """From a function giving the link between two GPU indices (called once per pair)."""
        pairs = itertools.combinations(gpus, 2)
        return cls(tuple(gpus), tuple(numa), tuple(link(a, b) for a, b in pairs))

    def link(self, a: int, b: int) -> Link:
        """The link between GPUs `a` and `b` (indices); KeyError for a GPU it does not describe."""
        pa, pb = sorted((self._position[a], self._position[b]))
        if pa == pb:
            raise KeyError(f"GPU {a} has no link to itself")
        count = len(self.gpus)
        return self.links[pa * (2 * count - pa - 1) // 2 + (pb - pa - 1)]

    def numa_of(self, gpu: int) -> int:
        return self.numa[self._position[gpu]]

    def describes(self, gpu: int) -> bool:
        return gpu in self._position

    def encode(self) -> str:
        """The annotation's value (compact JSON, see the module's docstring)."""
        document = {"gpus": list(self.gpus), "numa": list(self.numa), "links": [str(x) for x in self.links]}
        return json.dumps(document, separators=(",", ":"))

    def set_score(self, cards: Sequence[int]) -> tuple[int, int]:
        """(worst pair rank, sum of pair ranks) of a card set, by GPU index; a set of fewer than two
        cards has no pair and scores (math.inf-like maximum, 0). KeyError for an undescribed GPU."""
        positions = [self._position[card] for card in cards]
        worst, total = _NO_PAIR, 0
        for a, b in itertools.combinations(positions, 2):
            rank = self._ranks[a][b]
            total += rank
            worst = min(worst, rank)
        return worst, total


_NO_PAIR = _NVLINK_BASE + MAX_NVLINKS + 1  # above any rank: a lone card is never slowed by a link


def _int_list(document: Mapping[str, Any], name: str) -> list[int]:
    value = document.get(name)
    if not isinstance(value, list) or not all(type(item) is int for item in value):
        raise ValueError(f"{name!r} must be a list of integers")
    return value


def decode_topology(text: str) -> Topology:
    """The annotation's value; AnnotationError naming the annotation and the fault."""
    try:
        document = jsontext.loads(text)
        if not isinstance(document, dict):
            raise ValueError("the value must be a JSON object")
        gpus, numa = _int_list(document, "gpus"), _int_list(document, "numa")
        if any(gpu < 0 for gpu in gpus):
            raise ValueError("GPU indices must not be negative")
        if any(node < UNKNOWN_NUMA for node in numa):
            raise ValueError(f"NUMA nodes must be >= 0, or {UNKNOWN_NUMA} when unknown")
        links = document.get("links")
        if not isinstance(links, list) or not all(isinstance(item, str) for item in links):
            raise ValueError("'links' must be a list of strings")
        return Topology(tuple(gpus), tuple(numa), tuple(parse_link(item) for item in links))
    except ValueError as err:  # undecodable text included (jsontext.loads)
        raise AnnotationError(f"node annotation {TOPOLOGY_KEY}: {err}") from None


def node_topology(node: objects.Obj) -> Topology | None:
    """The node's published topology; None without the annotation, AnnotationError when malformed."""
    text = objects.annotations_of(node).get(TOPOLOGY_KEY)
    return None if text is None else _decoded(text)


@functools.lru_cache(maxsize=256)
def _decoded(text: str) -> Topology:
    """Nodes of one model publish the same value: decode it once."""
    return decode_topology(text)


def best_set(
    topology: Topology | None, candidates: Sequence[int], count: int, kept: Sequence[int] = ()
) -> tuple[int, ...]:
    """`count` of `candidates` (GPU indices, in the caller's order of preference) that, with the
    cards already `kept` (fixed, not returned), make the set with the best `set_score`; ties go
    to the set that comes first in the caller's order, and the result keeps that order. Without
    a topology, when it leaves a card undescribed, or with nothing to choose: the first `count`
    candidates."""
    chosen = tuple(candidates[:count])
    if topology is None or count >= len(candidates) or count < (1 if kept else 2):
        return chosen
    if not all(topology.describes(card) for card in (*kept, *candidates)):
        return chosen
    return _best(topology, tuple(kept), tuple(candidates), count)


@functools.lru_cache(maxsize=4096)
def _best(
    topology: Topology, kept: tuple[int, ...], candidates: tuple[int, ...], count: int
) -> tuple[int, ...]:
    """Cached: a scheduler asks the same question for every node of one model and free-card set."""
    sets: Iterable[tuple[int, ...]]
    if math.comb(len(candidates), count) <= EXHAUSTIVE_LIMIT:
        sets = itertools.combinations(candidates, count)
    else:
        sets = [_grow(topology, kept, candidates, seed, count) for seed in candidates]
    # combinations and seeds come in preference order, and max keeps the first of equal scores
    best = max(sets, key=lambda cards: topology.set_score((*kept, *cards)))
    return tuple(sorted(best, key=candidates.index))


def _grow(
    topology: Topology, kept: tuple[int, ...], candidates: tuple[int, ...], seed: int, count: int
) -> tuple[int, ...]:
    """A set grown from `seed`, each step adding the candidate that scores it (with `kept`) best."""
    cards = [seed]
    rest = [card for card in candidates if card != seed]
    while len(cards) < count:
        pick = max(rest, key=lambda card: topology.set_score((*kept, *cards, card)))  # max keeps the first
        cards.append(pick)
        rest.remove(pick)
    return tuple(cards)
