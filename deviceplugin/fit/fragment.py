"""The `gpu-aware` node score: how much usable GPU capacity a placement leaves (docs/gpu-aware.md).

A node's usable capacity is counted per class of pod the cluster serves: 1, 2, 4 and 8 whole GPUs
(`BLOCK_SIZES`) and, where cards are shared, a share of a card. For each class, how many GPUs'
worth of such pods could still get on the node:

- k whole GPUs: k x the number of disjoint blocks of k idle healthy cards. With a topology (one
  that describes every healthy card) a block must be as well connected as the node's best k
  healthy cards: its slowest link (`Topology.set_score`) no slower than theirs, so two idle pairs
  on two NVLink islands are no 4-GPU block on a node with 4-card NVLink islands. Without one,
  any k idle cards are a block.
- a share (`Sharing` "memory" or "slots"): the idle cards, plus the free fraction of each card in
  use that can still take a pod; free memory behind a card's full slots or cores is stranded.

`usable` is the mean over the classes, in GPUs (0 .. healthy cards). For a placement:
`loss` = usable before - usable after; `left` = 100 x usable after / healthy cards;
`keep` = 100 x (1 - loss / LOSS_SCALE), at least 0. `blend` weighs them into the policy's score.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from deviceplugin.fit.codec import physical_uuid
from deviceplugin.fit.model import Assigned, GpuState
from deviceplugin.fit.topology import Topology, best_set

BLOCK_SIZES = (1, 2, 4, 8)  # whole-GPU pod sizes counted: 8 is a whole DGX-class node
LOSS_SCALE = 8.0  # GPUs' worth of usable capacity whose loss scores `keep` 0

Sharing = Literal["whole", "memory", "slots"]
"""How a card in use takes another pod: never (`whole`), while it has free memory (`memory`), or
while it also has a free slot and free cores (`slots`)."""


@dataclass(frozen=True, slots=True)
class Weights:
    """The blend's weights (the seed plugin's `weight` and `loss.weight`); both 0: off."""

    weight: float = 0.0  # of `left`
    loss_weight: float = 0.0  # of `keep`

    @property
    def on(self) -> bool:
        return self.weight > 0 or self.loss_weight > 0


@dataclass(frozen=True, slots=True)
class Taken:
    """What a pod takes of one card."""

    memory: int = 0
    cores: int = 0
    slots: int = 0


def taken_by(cards: Sequence[GpuState], devices: Iterable[Iterable[Assigned]]) -> dict[int, Taken]:
    """What a fit's devices take, by position in `cards` (matched by index, else by card UUID)."""
    by_index = {card.index: pos for pos, card in enumerate(cards)}
    by_uuid = {card.uuid: pos for pos, card in enumerate(cards)}
    taken: dict[int, Taken] = {}
    for container in devices:
        for device in container:
            if device.index is not None:
                pos = by_index.get(device.index)
            else:
                pos = by_uuid.get(physical_uuid(device.uuid))
            if pos is None:
                continue
            had = taken.get(pos, Taken())
            taken[pos] = Taken(had.memory + device.memory, had.cores + device.cores, had.slots + 1)
    return taken


def usable(
    cards: Sequence[GpuState],
    topology: Topology | None,
    sharing: Sharing,
    taken: Mapping[int, Taken] | None = None,
) -> float:
    """The node's usable capacity in GPUs (the module's docstring), with `taken` placed."""
    healthy: list[int] = []
    idle: list[int] = []
    shared = 0.0
    for pos, card in enumerate(cards):
        if not card.health:
            continue
        healthy.append(card.index)
        took = taken.get(pos) if taken else None
        if took is None and not card.pods:
            idle.append(card.index)
        elif sharing != "whole":
            shared += _room(card, took or Taken(), sharing)
    if topology is None or not all(topology.describes(gpu) for gpu in healthy):
        counts = tuple(len(idle) // size for size in BLOCK_SIZES)
    else:
        counts = _block_counts(topology, tuple(healthy), tuple(idle))
    classes: list[float] = [size * count for size, count in zip(BLOCK_SIZES, counts, strict=True)]
    if sharing != "whole":
        classes.append(len(idle) + shared)
    return sum(classes) / len(classes)


def _room(card: GpuState, took: Taken, sharing: Sharing) -> float:
    """The free fraction of a card in use that another pod can still get."""
    if card.memory <= 0:
        return 0.0
    if sharing == "slots" and (
        card.used_num + took.slots >= card.split_count or card.used_cores + took.cores >= card.cores
    ):
        return 0.0
    return max(0, card.memory - card.used_memory - took.memory) / card.memory


@functools.lru_cache(maxsize=8192)  # nodes of one model and state ask the same
def _block_counts(topology: Topology, healthy: tuple[int, ...], idle: tuple[int, ...]) -> tuple[int, ...]:
    """`_blocks` of each of BLOCK_SIZES."""
    return tuple(_blocks(topology, healthy, idle, size) for size in BLOCK_SIZES)


def _blocks(topology: Topology, healthy: tuple[int, ...], idle: tuple[int, ...], size: int) -> int:
    """Disjoint blocks of `size` idle cards, taken greedily best first."""
    if size == 1:
        return len(idle)
    if len(healthy) < size:
        return 0
    slowest = _slowest_link(topology, healthy, size)
    count, rest = 0, idle
    while len(rest) >= size:
        block = best_set(topology, rest, size)
        if topology.set_score(block)[0] < slowest:
            break
        count += 1
        rest = tuple(card for card in rest if card not in block)
    return count


@functools.lru_cache(maxsize=1024)
def _slowest_link(topology: Topology, healthy: tuple[int, ...], size: int) -> int:
    """The slowest link's rank in the node's best `size` healthy cards: what a block must match."""
    return topology.set_score(best_set(topology, healthy, size))[0]


@dataclass(frozen=True, slots=True)
class Fragment:
    """A placement's effect on a node's usable capacity (GPUs)."""

    healthy: int
    before: float
    after: float

    @property
    def loss(self) -> float:
        return max(0.0, self.before - self.after)

    @property
    def left(self) -> float:
        """0..100: the share of the node's healthy cards still usable after the placement."""
        return 100.0 * self.after / self.healthy if self.healthy else 0.0

    @property
    def keep(self) -> float:
        """0..100: 100 when the placement costs no usable capacity, 0 from LOSS_SCALE GPUs on."""
        return 100.0 * max(0.0, 1.0 - self.loss / LOSS_SCALE)


def fragment(
    cards: Sequence[GpuState],
    devices: Iterable[Iterable[Assigned]],
    topology: Topology | None,
    sharing: Sharing,
    before: float | None = None,
) -> Fragment:
    """The effect of placing `devices` (a fit's choice on `cards`) on the node's usable capacity;
    `before`: `usable(cards, topology, sharing)` when the caller kept it."""
    healthy = sum(1 for card in cards if card.health)
    if before is None:
        before = usable(cards, topology, sharing)
    after = usable(cards, topology, sharing, taken_by(cards, devices))
    return Fragment(healthy, before, after)


def blend(base: float, placed: Fragment, weights: Weights) -> float:
    """The node's score, 0..100: (base + weight x left + loss.weight x keep) / (1 + weight +
    loss.weight), where `base` is the binpack/spread score. Both weights 0: `base` itself."""
    if not weights.on:
        return base
    total = base + weights.weight * placed.left + weights.loss_weight * placed.keep
    return total / (1.0 + weights.weight + weights.loss_weight)
