"""Ascend vNPU fit (Volcano `deviceshare`, HAMi mode): requests, templates, card fit, card order.

A card is a `GpuState` (uuid = chip ID, memory = `devmem`, split_count = `count`, cores =
`devcore`, mode = `hami-core` when its node runs the hami-core soft split, else
`TEMPLATE_MODE`). Volcano's rules (`pkg/scheduler/api/devices/ascend/hami/device_info.go`):

- a pod without `huawei.com/vnpu-mode: hami-core` gets templates: its memory is rounded up to the
  smallest template holding it, or to the whole card (`memoryAllocatable`, no template) up to
  `memoryCapacity`; a request for several cards must take whole cards;
- a hami-core pod asks exact memory and cores in percent of a card (100 per card), only on nodes
  that run hami-core;
- cards are visited by score (binpack: the fullest by memory, spread: idle ones), each card serves
  at most one container of a pod, and the node's score sums the first card of each container.

compat="volcano" keeps Volcano's quirks; the default fixes them (docs/ascend.md): memory above the
chip's capacity is refused (Volcano books 0 MiB and binds it as `vir01`), and so is a card
registering more memory than that capacity for a template pod (Volcano books its whole card as
0 MiB, a `vir01`: HAMi's device plugin registers its own `memoryAllocatable`, so such a card comes
from a plugin configured for another chip, whose templates are not these), unhealthy cards are not
used (Volcano ignores health), tied cards are taken in registration order (Volcano: Go's map
order, i.e. at random), and malformed quantities are refused (Volcano reads them as 0).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deviceplugin.fit import amounts, goint, objects
from deviceplugin.fit.ascend_config import VnpuChip
from deviceplugin.fit.errors import RequestError
from deviceplugin.fit.model import (
    BINPACK,
    SPREAD,
    Assigned,
    Compat,
    ContainerRequest,
    FitResult,
    GpuState,
    check_policy,
    is_volcano_compat,
)

VNPU_MODE = "huawei.com/vnpu-mode"  # pod annotation
HAMI_CORE = "hami-core"  # its value for the soft split, and a hami-core card's mode
NODE_HAMI_CORE = "hami-vnpu-core"  # node annotation: "true" when the node runs hami-core
TEMPLATE_MODE = "template"  # the mode of a card whose node does not run hami-core
HAMI_CORE_CORES = 100  # a hami-core card's cores, in percent
_SCORE_SCALE = 100.0

Shuffle = Callable[[list[tuple[float, GpuState]]], None]


@dataclass(frozen=True, slots=True)
class AscendFit(FitResult):
    """A fit, and whether the pod runs hami-core (its bind then writes memory and cores, not a
    template name)."""

    hami_core: bool = False


def is_hami_core(pod: objects.Obj) -> bool:
    return objects.annotations_of(pod).get(VNPU_MODE) == HAMI_CORE


def node_runs_hami_core(node: objects.Obj, default: bool) -> bool:
    """The node's `hami-vnpu-core` annotation ("true" is yes, any other value no), else the
    `vnpus.hamiVnpuCore` setting."""
    value = objects.annotations_of(node).get(NODE_HAMI_CORE)
    return default if value is None else value == "true"


def trim_memory(chip: VnpuChip, memory: int) -> tuple[int, str]:
    """(memory booked, template name): the smallest template holding `memory`; the whole card
    (`memoryAllocatable`, no name) up to `memoryCapacity`; else (0, "")."""
    for template in chip.templates:
        if memory <= template.memory:
            return template.memory, template.name
    if memory <= chip.memory_capacity:
        return chip.memory_allocatable, ""
    return 0, ""


# --- requests ----------------------------------------------------------------------------------


def _volcano_request(container: objects.Obj, chip: VnpuChip) -> ContainerRequest | None:
    """`devices.ExtractResourceRequest`: AsInt64 wrapped to int32, 0 where AsInt64 refuses."""

    def amount(name: str) -> int:
        return amounts.volcano(container, name) or 0

    nums = amounts.volcano_count(container, chip.resource_name, chip.resource_memory_name)
    if nums is None:
        return None
    memory = amount(chip.resource_memory_name)
    return ContainerRequest(
        name=objects.container_name(container),
        nums=nums,
        type=chip.common_word,
        memory=memory,
        memory_percentage=100 if memory == 0 else None,
        cores=amount(chip.resource_core_name),
    )


def _strict_request(
    container: objects.Obj, chip: VnpuChip, hami_core: bool, where: str
) -> ContainerRequest | None:
    count = amounts.strict(container, chip.resource_name, where)
    memory = amounts.strict(container, chip.resource_memory_name, where)
    cores = amounts.strict(container, chip.resource_core_name, where)
    limited = objects.limits(container)
    if count == 0 or (chip.resource_name not in limited and chip.resource_memory_name not in limited):
        if memory or cores or (count is None and memory is not None):
            raise RequestError(
                f"{where}: {chip.resource_memory_name} and {chip.resource_core_name} need a limit of "
                f"{chip.resource_name} (1 or more) or of {chip.resource_memory_name}"
            )
        return None
    if hami_core and cores is not None and cores > HAMI_CORE_CORES:
        raise RequestError(
            f"{where}: {chip.resource_core_name} is {cores}; a hami-core card has 100 (percent)"
        )
    if not hami_core and memory is not None and memory > chip.memory_capacity:
        raise RequestError(
            f"{where}: {chip.resource_memory_name} is {memory} MiB, above the {chip.memory_capacity} MiB of "
            f"a {chip.common_word} card (Volcano books such a request as 0 MiB and binds it as the "
            "smallest template)"
        )
    return ContainerRequest(
        name=objects.container_name(container),
        nums=1 if count is None else count,
        type=chip.common_word,
        memory=memory or 0,
        memory_percentage=100 if not memory else None,
        cores=cores or 0,
    )


def parse_ascend_requests(pod: objects.Obj, chip: VnpuChip, compat: Compat = None) -> list[ContainerRequest]:
    """The request of each app container that limits the chip's count or memory resource, in
    container order (`memory_percentage` 100: no memory given, the whole card).

    By default a request that cannot be served as written is a `RequestError`: a fractional or
    negative quantity, memory or cores without the count or memory limit, cores above 100 for
    a hami-core pod, template memory above the chip's capacity, the chip's resources on an init
    container. Volcano reads all of these as something else (0, or one card) instead.
    """
    if is_volcano_compat(compat):
        parsed = (_volcano_request(container, chip) for container in objects.containers(pod))
        return [request for request in parsed if request is not None]
    pod_name = objects.display_name(pod)
    names = (chip.resource_name, chip.resource_memory_name, chip.resource_core_name)
    for container in objects.init_containers(pod):
        asked = objects.limits(container).keys() | objects.requests(container).keys()
        if any(name in asked for name in names):
            raise RequestError(
                f"pod {pod_name} init container {objects.container_name(container)!r}: "
                f"{chip.common_word} vNPUs are served to app containers only"
            )
    hami_core = is_hami_core(pod)
    requests = []
    for container in objects.containers(pod):
        where = f"pod {pod_name} container {objects.container_name(container)!r}"
        request = _strict_request(container, chip, hami_core, where)
        if request is not None:
            requests.append(request)
    return requests


# --- cards ---------------------------------------------------------------------------------------


def card_score(policy: str, card: GpuState) -> float:
    """Volcano's `CalScore` on the card's usage before the pod: binpack 100 x used/total memory,
    spread 100 for an idle card, otherwise (and for a card without memory) 0."""
    if card.memory == 0:
        return 0.0
    if policy == BINPACK:
        return _SCORE_SCALE * (card.used_memory / card.memory)
    if policy == SPREAD:
        return _SCORE_SCALE if card.used_num == 0 else 0.0
    return 0.0


def card_fits(card: GpuState, memory: int, cores: int, hami_core: bool, volcano: bool) -> bool:
    """Volcano's per-card `fit` for one container (Go's int32 arithmetic under compat)."""
    wrap = goint.int32 if volcano else int
    if hami_core and card.mode != HAMI_CORE:
        return False
    if card.split_count <= card.used_num or wrap(card.memory - card.used_memory) < memory:
        return False
    total = HAMI_CORE_CORES if hami_core else card.cores
    if wrap(total - card.used_cores) < cores:
        return False
    if total == HAMI_CORE_CORES and cores == HAMI_CORE_CORES and card.used_num > 0:
        return False  # a whole hami-core card is exclusive
    return not (total != 0 and card.used_cores == total and cores == 0)


def card_order(cards: Sequence[GpuState], policy: str, volcano: bool, shuffle: Shuffle) -> list[GpuState]:
    """Cards by descending score. Volcano starts from Go's map order and sorts unstably, so tied
    cards come in any order (`shuffle`); the default keeps registration order among ties and
    leaves unhealthy cards out."""
    scored = [(card_score(policy, card), card) for card in cards if volcano or card.health]
    if volcano:
        shuffle(scored)
    scored.sort(key=lambda item: -item[0])
    return [card for _, card in scored]


# --- fit -----------------------------------------------------------------------------------------


def _need(request: ContainerRequest, chip: VnpuChip, first: GpuState, hami_core: bool, volcano: bool) -> int:
    """The memory each chosen card books for the request (Volcano: computed once, from the
    highest-scored card, in int32)."""
    memory = request.memory
    if memory == 0 and request.memory_percentage:
        product = first.memory * request.memory_percentage
        memory = goint.int64_div(goint.int32(product) if volcano else product, 100)
    if memory > 0 and not hami_core:
        memory = trim_memory(chip, memory)[0]
    return goint.int32(memory) if volcano else memory


def _oversized_note(cards: Sequence[GpuState], chip: VnpuChip) -> str:
    """Why the cards registering more than the chip's capacity were left out (empty: none were)."""
    return "".join(
        f"; card {card.uuid} registers {card.memory} MiB, above the {chip.memory_capacity} MiB "
        f"memoryCapacity of {chip.common_word} (its device plugin is configured for another chip): "
        "no template pod is placed on it"
        for card in cards
    )


def fit_ascend(
    cards: Sequence[GpuState],
    pod: objects.Obj,
    requests: Sequence[ContainerRequest],
    chip: VnpuChip,
    *,
    policy: str | None,
    compat: Compat = None,
    shuffle: Shuffle = random.shuffle,
) -> AscendFit:
    """Choose the cards of each container on one node (Volcano's `selectDevices`), with the
    node's score (`ScoreNode`: the summed score of each container's first card). Never changes
    `cards`."""
    volcano = is_volcano_compat(compat)
    policy_name = check_policy(policy, volcano)
    hami_core = is_hami_core(pod)
    word = chip.common_word
    oversized = [] if volcano or hami_core else [card for card in cards if card.memory > chip.memory_capacity]
    usable_cards = [card for card in cards if card.memory <= chip.memory_capacity] if oversized else cards
    order = card_order(usable_cards, policy_name, volcano, shuffle)
    why_not = _oversized_note(oversized, chip)
    if not order:
        usable = "" if volcano or not cards else " usable" if oversized else " healthy"
        return AscendFit(
            ok=False,
            reason=f"no{usable} {word} card is registered on the node{why_not}",
            hami_core=hami_core,
        )
    chosen: set[str] = set()
    devices: list[tuple[Assigned, ...]] = []
    score = 0.0
    for request in requests:
        memory = _need(request, chip, order[0], hami_core, volcano)
        if not hami_core and request.nums > 1 and trim_memory(chip, memory)[0] != chip.memory_allocatable:
            return AscendFit(
                ok=False,
                reason=f"container {request.name!r}: {request.nums} {word} cards must be whole cards "
                "(no memory, or more than the largest template); vNPU templates split one card only",
                hami_core=hami_core,
            )
        taken: list[GpuState] = []
        for card in order:
            if card.uuid not in chosen and card_fits(card, memory, request.cores, hami_core, volcano):
                taken.append(card)
                if len(taken) >= request.nums:
                    break
        if len(taken) < request.nums:
            mode = "hami-core" if hami_core else "template"
            return AscendFit(
                ok=False,
                reason=f"container {request.name!r}: {len(taken)} of the {request.nums} {word} cards it "
                f"needs have {memory} MiB and {request.cores} cores free ({mode} mode){why_not}",
                hami_core=hami_core,
            )
        chosen.update(card.uuid for card in taken)
        devices.append(tuple(Assigned(card.uuid, card.index, word, memory, request.cores) for card in taken))
        if taken:  # Volcano indexes an empty list here (a count of 0 that found no card) and panics
            score += card_score(policy_name, taken[0])
    return AscendFit(ok=True, devices=tuple(devices), score=score, hami_core=hami_core)
