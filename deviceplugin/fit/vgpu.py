"""vGPU fit (Volcano `hamivgpu`): request parsing, per-card rules, card order and scores.

`fit_vgpu` never mutates its inputs: tentative usage lives in local counters, so a failed fit
needs no rollback and a successful one is Volcano's FilterNode decision. See docs/fit.md for every
place where the default rules differ from Volcano's (compat="volcano").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from deviceplugin.fit import amounts, goint, keys, objects
from deviceplugin.fit.codec import encode_mig_id, encode_mig_id_volcano
from deviceplugin.fit.errors import NodeRegisterError, RequestError
from deviceplugin.fit.filters import TypeFilter, UuidFilter
from deviceplugin.fit.linked import linked_choice
from deviceplugin.fit.mig import GroupSlot, pick_slot, pick_slot_volcano
from deviceplugin.fit.model import (
    DEFAULT_VGPU_CONFIG,
    Assigned,
    Compat,
    ContainerRequest,
    FitResult,
    GpuState,
    VgpuConfig,
    is_volcano_compat,
)
from deviceplugin.fit.policy import Policy, policy_of
from deviceplugin.fit.topology import Topology

_PERCENT_UNSET = 101  # Volcano's sentinel for "no memory percentage given"


# --- request parsing -------------------------------------------------------------------------


def _parse_volcano(container: objects.Obj, config: VgpuConfig) -> ContainerRequest | None:
    nums = amounts.volcano_count(container, config.count_resource, config.memory_resource)
    if nums is None:
        return None
    memory = amounts.volcano(container, config.memory_resource) or 0
    percentage = amounts.volcano(container, config.percentage_name(volcano=True))
    if percentage is None:
        percentage = _PERCENT_UNSET
    if percentage == _PERCENT_UNSET and memory == 0:
        percentage = 100
    cores = amounts.volcano(container, config.cores_resource) or 0
    return ContainerRequest(
        name=objects.container_name(container),
        nums=nums,
        memory=memory,
        memory_percentage=None if percentage == _PERCENT_UNSET else percentage,
        cores=cores,
    )


def _parse_strict(container: objects.Obj, config: VgpuConfig, where: str) -> ContainerRequest | None:
    percentage_name = config.percentage_name(volcano=False)
    count = amounts.strict(container, config.count_resource, where)
    memory = amounts.strict(container, config.memory_resource, where)
    percentage = amounts.strict(container, percentage_name, where)
    cores = amounts.strict(container, config.cores_resource, where)
    if count == 0:
        if memory or percentage or cores:
            raise RequestError(f"{where}: {config.count_resource} is 0 but GPU memory or cores are requested")
        return None
    if count is None:
        if memory is None and percentage is None:
            if cores is not None:
                raise RequestError(
                    f"{where}: {config.cores_resource} needs "
                    f"{config.count_resource} or {config.memory_resource}"
                )
            return None
        count = 1
    if percentage is not None:
        if memory:
            raise RequestError(f"{where}: give {config.memory_resource} or {percentage_name}, not both")
        if not 1 <= percentage <= 100:
            raise RequestError(f"{where}: {percentage_name} must be 1..100, not {percentage}")
    elif not memory:
        percentage = 100  # no memory asked: the whole card
    if cores and cores > 100:
        raise RequestError(f"{where}: {config.cores_resource} is {cores}; a GPU has 100")
    return ContainerRequest(
        name=objects.container_name(container),
        nums=count,
        memory=memory or 0,
        memory_percentage=percentage,
        cores=cores or 0,
    )


def _vgpu_names(config: VgpuConfig) -> tuple[str, ...]:
    names = (
        config.count_resource,
        config.memory_resource,
        config.percentage_name(False),
        config.cores_resource,
    )
    return tuple(name for name in names if name)


def parse_vgpu_requests(
    pod: objects.Obj, config: VgpuConfig = DEFAULT_VGPU_CONFIG, compat: Compat = None
) -> list[ContainerRequest]:
    """The vGPU request of each app container that has one, in container order.

    Raises `RequestError` (default mode) for a request that cannot be served as written: a
    non-integral or negative quantity, cores over 100, a percentage outside 1..100 or given with
    an explicit memory, cores without a count or memory, or a vGPU request on an init container.
    """
    volcano = is_volcano_compat(compat)
    if volcano:
        parsed = (_parse_volcano(c, config) for c in objects.containers(pod))
        return [request for request in parsed if request is not None]
    pod_name = objects.display_name(pod)
    names = _vgpu_names(config)
    for container in objects.init_containers(pod):
        asked = objects.limits(container).keys() | objects.requests(container).keys()
        if any(name in asked for name in names):
            raise RequestError(
                f"pod {pod_name} init container {objects.container_name(container)!r}: "
                "vGPU resources are served to app containers only"
            )
    result = []
    for container in objects.containers(pod):
        where = f"pod {pod_name} container {objects.container_name(container)!r}"
        request = _parse_strict(container, config, where)
        if request is not None:
            result.append(request)
    return result


def has_vgpu_request(
    pod: objects.Obj, config: VgpuConfig = DEFAULT_VGPU_CONFIG, compat: Compat = None
) -> bool:
    """Volcano's `HasDeviceRequest`: a container limits the vGPU count or memory resource.

    The default also counts a memory percentage (B5), which Volcano's default config ignores.
    """
    volcano = is_volcano_compat(compat)
    names = [config.count_resource, config.memory_resource]
    if not volcano:
        names.append(config.percentage_name(volcano))
    return any(name in objects.limits(c) for c in objects.containers(pod) for name in names)


# --- scores ----------------------------------------------------------------------------------


def gpu_score(gpu: GpuState, policy: str | None, compat: Compat = None) -> float:
    """Score of one card holding the pod (call with the card's usage *after* adding the pod).

    binpack: 100 x used/total memory; spread: 100 for a card that was idle; unset: 0.
    """
    volcano = is_volcano_compat(compat)
    return policy_of(policy, volcano).card_score(gpu.used_num, gpu.used_memory, gpu.memory, volcano)


def node_score(score: float, weight: int) -> float:
    """Volcano's node order contribution: round-half-up of the summed card scores times weight
    (0 when weight <= 0), through Go's int64 conversion (out of range or NaN: math.MinInt64)."""
    if weight <= 0:
        return 0.0
    rounded = score + 0.5
    if math.isfinite(rounded):
        rounded = math.floor(rounded)
    return float(goint.float_to_int64(rounded)) * weight


# --- fit -------------------------------------------------------------------------------------


def _card_order(
    policy: Policy, cards: Sequence[GpuState], used_num: list[int], used_mem: list[int], volcano: bool
) -> list[int]:
    """Visiting order for one container, from the counters as they stand before it."""
    positions = range(len(cards))
    key = policy.card_key
    if key is not None:
        return sorted(positions, key=lambda p: key(cards[p], used_num[p], used_mem[p]))
    if volcano:
        return _volcano_unset_order(cards)
    return sorted(positions, key=lambda p: -cards[p].index)


def _volcano_unset_order(cards: Sequence[GpuState]) -> list[int]:
    """Volcano visits map keys n-1..0 (n = card count), assuming indices 0..n-1; a registration
    with an empty entry leaves a gap, and Go dereferences the missing card (a nil-pointer panic,
    raised here as an error when the walk reaches it)."""
    position = {card.index: pos for pos, card in enumerate(cards)}
    order = []
    for index in range(len(cards) - 1, -1, -1):
        if index not in position:
            order.append(-1 - index)  # marks the missing card for the walk
        else:
            order.append(position[index])
    return order


def _same_group(card: GpuState, group: str) -> bool:
    return any(u.group == group and (u.memory > 0 or u.cores > 0) for u in card.pods.values())


def _matched_rules(labels: Mapping[str, str], rules: Sequence[Mapping[str, str]]) -> frozenset[int]:
    """Rules whose every label the pod carries; an empty rule matches nothing (Volcano drops it
    when it reads its arguments)."""
    return frozenset(
        n for n, rule in enumerate(rules) if rule and all(labels.get(k) == v for k, v in rule.items())
    )


def _excluded(card: GpuState, rules: Sequence[Mapping[str, str]], mine: frozenset[int]) -> bool:
    return any(_matched_rules(u.labels, rules) & mine for u in card.pods.values())


def _amount(memory: int, factor: int) -> str:
    """A memory amount for a message: the registration and the requests count memory units of
    `factor` MiB on a node with a memory factor (`--gpu-memory-factor`)."""
    return f"{memory} MiB" if factor == 1 else f"{memory} units of {factor} MiB"


def _describe(request: ContainerRequest, factor: int) -> str:
    if request.memory_percentage is not None:
        memory = f"{request.memory_percentage}% memory"
    else:
        memory = _amount(request.memory, factor)
    return f"{request.nums} GPU(s) of {memory} and {request.cores} cores"


def _failure(
    pod: objects.Obj,
    request: ContainerRequest,
    headline: str,
    walk: _Walk,
    rejected: Sequence[tuple[int, str]],
) -> FitResult:
    cards = walk.cards
    details = "; ".join(f"GPU {cards[p].index} ({cards[p].uuid}): {why}" for p, why in rejected)
    where = f"pod {objects.display_name(pod)} container {request.name!r} ({_describe(request, walk.factor)})"
    return FitResult(ok=False, reason=f"{where}: {headline}" + (f" [{details}]" if details else ""))


class _MigTentative:
    """Per-fit copy of MIG slot usage, so one pod's containers never share a slot (B9)."""

    __slots__ = ("active", "used")

    def __init__(self, card: GpuState) -> None:
        assert card.mig is not None
        self.active = card.mig.active
        self.used = {name: list(slots) for name, slots in card.mig.used.items()}

    def book(self, slot: GroupSlot, card: GpuState) -> None:
        assert card.mig is not None
        group = card.mig.groups[slot.group]
        located = group.locate(slot.position)
        assert located is not None
        self.active = slot.group
        self.used.setdefault(group.instances[located[0]].name, []).append(located[1])


def fit_vgpu(
    gpus: Sequence[GpuState],
    requests: Sequence[ContainerRequest],
    pod: objects.Obj,
    policy: str | None = None,
    compat: Compat = None,
    *,
    config: VgpuConfig = DEFAULT_VGPU_CONFIG,
    exclusive_rules: Sequence[Mapping[str, str]] = (),
    topology: Topology | None = None,
) -> FitResult:
    """Place each container request on the node's cards; later containers see earlier ones.

    Cards are tried in policy order (binpack: most used memory first; spread: fewest tenants
    first; unset: highest index first) and skipped, in this order, when: unhealthy or of another
    sharing mode (default only), excluded by the UUID filter, out of share slots (or blocked by an
    exclusivity rule), holding a pod of the same pod group (podgroup spread), short of memory,
    short of cores, shared while the request wants all 100 cores, saturated at 100 cores for a
    zero-core request, of the wrong type, or (MIG) without a free slot big enough.
    `exclusive_rules` are Volcano's `GPUExclusiveRules` (label maps). By default, on a node with
    a `topology` and no MIG card, a container asking several GPUs takes the best-linked of the
    cards the policy rates alike (`_linked_order`); compat="volcano" reads no topology.
    """
    volcano = is_volcano_compat(compat)
    chosen_policy = policy_of(policy, volcano)
    if not requests:
        return FitResult(ok=True)
    cards = sorted(gpus, key=lambda g: g.index)
    notes = objects.annotations_of(pod)  # read once: it checks every value
    refusal = _mode_refusal(pod, notes, cards, volcano)
    if refusal is not None:
        return FitResult(ok=False, reason=refusal)
    walk = _Walk.of(cards, pod, notes, volcano, config=config, exclusive_rules=exclusive_rules)
    placed: list[tuple[Assigned, ...]] = []
    score = 0.0
    for request in requests:
        if request.nums > len(cards):
            return _failure(pod, request, f"needs {request.nums} GPUs; the node has {len(cards)}", walk, ())
        placement = _place(walk, request, chosen_policy, score, topology)
        if placement.remaining > 0:
            if walk.uuid_filter.active and not placement.selectable:
                headline = "no GPU matches the pod's GPU UUID annotations"
            else:
                headline = f"only {request.nums - placement.remaining} of {request.nums} GPU(s) fit"
            return _failure(pod, request, headline, walk, placement.rejected)
        placed.append(tuple(placement.chosen))
        score = placement.score
    return FitResult(ok=True, devices=tuple(placed), score=score)


# --- quick fit: fit_vgpu's decision for the common pod, for a scheduler screening many nodes ------


def plain_request(pod: objects.Obj, requests: Sequence[ContainerRequest], compat: Compat) -> bool:
    """Whether `quick_vgpu` decides this pod exactly as `fit_vgpu` does (compat None, no
    exclusivity rules): one container, and none of the annotations that change which cards it
    may use (sharing mode, GPU UUID or type lists, pod-group spread)."""
    if is_volcano_compat(compat) or len(requests) != 1:
        return False
    notes = objects.annotations_of(pod)
    return (
        keys.VGPU_MODE not in notes
        and not UuidFilter.of(notes).active
        and not TypeFilter.of(notes, False).active
        and notes.get(keys.VGPU_PODGROUP_POLICY) != keys.PODGROUP_POLICY_SPREAD
    )


def visiting_order(gpus: Sequence[GpuState], policy: Policy, compat: Compat) -> tuple[GpuState, ...] | None:
    """The cards in the order `fit_vgpu` visits them for a pod's first container (it depends on
    the node's usage only), or None where `quick_vgpu` cannot decide: Volcano's rules, MIG cards."""
    if is_volcano_compat(compat):
        return None
    cards = sorted(gpus, key=lambda g: g.index)
    if any(card.mode == keys.MODE_MIG for card in cards):
        return None
    used_num = [card.used_num for card in cards]
    used_mem = [card.used_memory for card in cards]
    return tuple(cards[pos] for pos in _card_order(policy, cards, used_num, used_mem, False))


def quick_vgpu(order: Sequence[GpuState], request: ContainerRequest, policy: Policy) -> float | None:
    """`fit_vgpu`'s score for a `plain_request` on a node's cards in `visiting_order`, None when it
    does not fit: the room rules of `_place` for a card without MIG, exclusivity rules or pod
    group, without the result or messages."""
    remaining = request.nums
    if remaining > len(order):
        return None
    percentage, cores = request.memory_percentage, request.cores
    many = remaining > 1
    score = 0.0
    for card in order:
        used_num, used_mem, used_cores = card.used_num, card.used_memory, card.used_cores
        need = request.memory if percentage is None else card.memory * percentage // 100
        if (
            not card.health
            or (many and card.mode == keys.MODE_MPS)
            or card.split_count <= used_num
            or card.memory - used_mem < need
            or used_cores + cores > card.cores
            or (cores == card.cores and used_num > 0)
            or (used_cores == card.cores and cores == 0)
            or request.type not in card.type
        ):
            continue
        score += policy.card_score(used_num + 1, used_mem + need, card.memory, False)
        remaining -= 1
        if remaining == 0:
            return score
    return None


def _volcano_node_mode(cards: Sequence[GpuState]) -> str:
    return cards[-1].mode if cards else keys.MODE_HAMI_CORE  # the last card decides (B14)


def _mode_refusal(
    pod: objects.Obj, notes: Mapping[str, str], cards: Sequence[GpuState], volcano: bool
) -> str | None:
    """Why the pod's sharing-mode annotation rules the whole node out; None if it does not."""
    wanted = notes.get(keys.VGPU_MODE)
    if wanted is None:
        return None
    if volcano:
        node_mode = _volcano_node_mode(cards)
        if wanted != node_mode:
            return (
                f"pod {objects.display_name(pod)} asks for sharing mode {wanted!r}; "
                f"the node runs {node_mode!r}"
            )
    elif wanted not in keys.SHARING_MODES:
        return (
            f"pod {objects.display_name(pod)}: {keys.VGPU_MODE} "
            f"{wanted!r} is not one of {', '.join(keys.SHARING_MODES)}"
        )
    return None


@dataclass
class _Walk:
    """One fit's view of the node: its cards, what the pod allows, and the tentative usage that
    grows as containers are placed. In Volcano mode the counters are Go uints, kept modulo 2^64
    so wrapped values order, compare and score as they do there."""

    cards: list[GpuState]
    volcano: bool
    wanted_mode: str | None
    uuid_filter: UuidFilter
    type_filter: TypeFilter
    group: str  # the pod's pod group under podgroup spread, else ""
    blocked: list[bool]  # per card: holds a pod of one of the pod's exclusivity rules
    mig: list[bool]  # per card: placed by MIG slot
    factor: int  # MIG slot sizes are in memory units of this many MiB
    used_num: list[int]
    used_mem: list[int]
    used_core: list[int]
    tentative_mig: dict[int, _MigTentative] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        cards: list[GpuState],
        pod: objects.Obj,
        notes: Mapping[str, str],
        volcano: bool,
        *,
        config: VgpuConfig,
        exclusive_rules: Sequence[Mapping[str, str]],
    ) -> _Walk:
        if volcano:
            mig = [_volcano_node_mode(cards) == keys.MODE_MIG] * len(cards)
        else:
            mig = [card.mode == keys.MODE_MIG for card in cards]
        spread_group = notes.get(keys.VGPU_PODGROUP_POLICY) == keys.PODGROUP_POLICY_SPREAD
        mine = _matched_rules(objects.labels_of(pod), exclusive_rules) if exclusive_rules else frozenset()
        blocked = [False] * len(cards)
        if mine:
            blocked = [
                not on_mig and _excluded(card, exclusive_rules, mine)
                for card, on_mig in zip(cards, mig, strict=True)
            ]
        used_num = [card.used_num for card in cards]
        used_mem = [card.used_memory for card in cards]
        used_core = [card.used_cores for card in cards]
        if volcano:  # Go's uint counters
            used_num, used_mem, used_core = (
                [goint.uint64(v) for v in c] for c in (used_num, used_mem, used_core)
            )
        return cls(
            cards=cards,
            volcano=volcano,
            wanted_mode=notes.get(keys.VGPU_MODE),
            uuid_filter=UuidFilter.of(notes),
            type_filter=TypeFilter.of(notes, volcano),
            group=objects.podgroup_key(pod) if spread_group else "",
            blocked=blocked,
            mig=mig,
            factor=config.memory_factor if config.memory_factor > 1 else 1,
            used_num=used_num,
            used_mem=used_mem,
            used_core=used_core,
        )

    def counter(self, value: int) -> int:
        return goint.uint64(value) if self.volcano else value

    def core_capacity(self, card: GpuState) -> int:
        return 100 if self.volcano else card.cores

    def book(self, pos: int, memory: int, cores: int) -> None:
        self.used_num[pos] = self.counter(self.used_num[pos] + 1)
        self.used_mem[pos] = self.counter(self.used_mem[pos] + memory)
        self.used_core[pos] = self.counter(self.used_core[pos] + self.counter(cores))


# --- card rules: each names why a card cannot take the container, or returns None -----------

_CardRule = Callable[[_Walk, int, ContainerRequest], str | None]


def _unhealthy(walk: _Walk, pos: int, request: ContainerRequest) -> str | None:
    return None if walk.cards[pos].health else "unhealthy"


def _other_mode(walk: _Walk, pos: int, request: ContainerRequest) -> str | None:
    card = walk.cards[pos]
    if walk.wanted_mode is None or card.mode == walk.wanted_mode:
        return None
    return f"runs {card.mode}, pod asks for {walk.wanted_mode}"


def _mps_many_gpus(walk: _Walk, pos: int, request: ContainerRequest) -> str | None:
    # A CUDA process connects to one MPS control daemon, and each GPU has its own (docs/mps.md).
    if request.nums > 1 and walk.cards[pos].mode == keys.MODE_MPS:
        return f"runs mps, which serves a container one GPU; it asks for {request.nums}"
    return None


def _uuid_excluded(walk: _Walk, pos: int, request: ContainerRequest) -> str | None:
    if walk.uuid_filter.active and not walk.uuid_filter.allows(walk.cards[pos].uuid):
        return "excluded by the pod's GPU UUID annotations"
    return None


def _exclusive(walk: _Walk, pos: int, request: ContainerRequest) -> str | None:
    return "holds a pod of the same GPU exclusivity rule" if walk.blocked[pos] else None


def _shares_taken(walk: _Walk, pos: int, request: ContainerRequest) -> str | None:
    card = walk.cards[pos]
    if walk.counter(card.split_count) <= walk.used_num[pos]:
        return f"all {card.split_count} shares taken"
    return None


def _same_pod_group(walk: _Walk, pos: int, request: ContainerRequest) -> str | None:
    if walk.group and _same_group(walk.cards[pos], walk.group):
        return f"holds a pod of the same pod group {walk.group}"
    return None


def _short_of_memory_rule(walk: _Walk, pos: int, request: ContainerRequest) -> str | None:
    card, used = walk.cards[pos], walk.used_mem[pos]
    need = _memory_need(card, request, walk.volcano)
    if _short_of_memory(card, used, need, walk.volcano):
        return f"{max(0, card.memory - used)} of {_amount(card.memory, walk.factor)} free, needs {need}"
    return None


def _short_of_cores(walk: _Walk, pos: int, request: ContainerRequest) -> str | None:
    capacity, used = walk.core_capacity(walk.cards[pos]), walk.used_core[pos]
    if walk.counter(used + walk.counter(request.cores)) > capacity:
        return f"{used} of {capacity} cores used, needs {request.cores}"
    return None


def _whole_cores_shared(walk: _Walk, pos: int, request: ContainerRequest) -> str | None:
    if request.cores == walk.core_capacity(walk.cards[pos]) and walk.used_num[pos] > 0:
        return "shared, but the request wants the whole GPU's cores"
    return None


def _cores_saturated(walk: _Walk, pos: int, request: ContainerRequest) -> str | None:
    if walk.used_core[pos] == walk.core_capacity(walk.cards[pos]) and request.cores == 0:
        return "all cores taken; a zero-core request cannot share it"
    return None


def _wrong_type(walk: _Walk, pos: int, request: ContainerRequest) -> str | None:
    card_type = walk.cards[pos].type
    if request.type not in card_type or not walk.type_filter.allows(card_type):
        return f"type {card_type!r} not allowed for this pod"
    return None


# Which cards the pod may use at all; Volcano checks neither health nor mode per card.
_DEFAULT_SELECTION: tuple[_CardRule, ...] = (_unhealthy, _other_mode, _mps_many_gpus, _uuid_excluded)
_VOLCANO_SELECTION: tuple[_CardRule, ...] = (_uuid_excluded,)
# Whether a selectable card has room for the container, in Volcano's order.
_ROOM: tuple[_CardRule, ...] = (
    _exclusive,
    _shares_taken,
    _same_pod_group,
    _short_of_memory_rule,
    _short_of_cores,
    _whole_cores_shared,
    _cores_saturated,
    _wrong_type,
)


def _first_refusal(
    rules: Sequence[_CardRule], walk: _Walk, pos: int, request: ContainerRequest
) -> str | None:
    for rule in rules:
        reason = rule(walk, pos, request)
        if reason is not None:
            return reason
    return None


class _Claim(NamedTuple):
    """What a card that takes the container books: the device ID written for it, the memory the
    request needs, and the memory counted as used (a MIG slot's whole size)."""

    device_id: str
    need: int
    booked: int


def _claim(walk: _Walk, pos: int, request: ContainerRequest) -> _Claim | str:
    """The card's claim for the container, reserving a MIG slot; a reason if no slot fits."""
    card = walk.cards[pos]
    need = _memory_need(card, request, walk.volcano)
    if not walk.mig[pos]:
        return _Claim(card.uuid, need, need)
    if card.mig is None:
        return f"MIG card with no configured geometry for type {card.type!r}"
    slot = _mig_slot(card, pos, walk.counter(need * walk.factor), walk.volcano, walk.tentative_mig)
    if slot is None:
        return f"no free MIG slot of {_amount(need, walk.factor)} or more"
    encode = encode_mig_id_volcano if walk.volcano else encode_mig_id
    if not walk.volcano:
        walk.tentative_mig[pos].book(slot, card)
    return _Claim(encode(card.uuid, slot.name, slot.position), need, slot.memory // walk.factor)


@dataclass
class _Placement:
    """One container's walk over the cards."""

    remaining: int  # GPUs still to find; <= 0 once placed
    chosen: list[Assigned] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    selectable: bool = False  # some card passed the selection rules
    score: float = 0.0  # the fit's score so far, this container's cards added in visiting order


def _place(
    walk: _Walk, request: ContainerRequest, policy: Policy, score: float, topology: Topology | None
) -> _Placement:
    """Walk the cards in policy order, booking each one that takes the container until it has
    its GPUs (Volcano books a card for a request of 0 or fewer GPUs too, and assigns none)."""
    placement = _Placement(remaining=request.nums, score=score)
    selection = _VOLCANO_SELECTION if walk.volcano else _DEFAULT_SELECTION
    cards = walk.cards
    order: Sequence[int] = _card_order(policy, cards, walk.used_num, walk.used_mem, walk.volcano)
    fitting: frozenset[int] = frozenset()  # cards known to pass every rule
    if topology is not None and request.nums > 1 and not walk.volcano and not any(walk.mig):
        order, fitting = _linked_order(walk, request, policy, order, topology)
    for pos in order:
        if pos < 0:
            raise NodeRegisterError(
                f"{keys.NODE_VGPU_REGISTER} has no GPU {-1 - pos} of {len(cards)}: Volcano's "
                "scheduler panics walking this node with no schedule policy (an empty entry)"
            )
        if pos in fitting:
            placement.selectable = True
            refusal = None
        else:
            refusal = _first_refusal(selection, walk, pos, request)
            if refusal is None:
                placement.selectable = True
                refusal = _first_refusal(_ROOM, walk, pos, request)
        claim = _claim(walk, pos, request) if refusal is None else refusal
        if isinstance(claim, str):
            placement.rejected.append((pos, claim))
            continue
        walk.book(pos, claim.booked, request.cores)
        if placement.remaining > 0:
            placement.remaining -= 1
            # Volcano writes the uint memory through int(): a wrapped request reads negative.
            memory = goint.int64(claim.need) if walk.volcano else claim.need
            card = cards[pos]
            placement.chosen.append(
                Assigned(claim.device_id, card.index, request.type, memory, request.cores)
            )
            placement.score += policy.card_score(
                walk.used_num[pos], walk.used_mem[pos], card.memory, walk.volcano
            )
        if placement.remaining == 0:
            break
    return placement


def _linked_order(
    walk: _Walk,
    request: ContainerRequest,
    policy: Policy,
    order: Sequence[int],
    topology: Topology,
) -> tuple[Sequence[int], frozenset[int]]:
    """`order` with the cards the container takes first: of the cards that can take it, those
    `linked_choice` picks (default mode, no MIG card, so a card the rules pass always takes it);
    and the cards that can take it. The policy rates a card by its preference (the first item of
    its card key: binpack the used memory, spread the tenants; none without a policy) and the
    score it would earn, so every choice it leaves the topology scores as the policy's own, in
    the same order of summing.
    `_place` trusts the second answer through its walk: a card's rules read its own counters and
    what the fit fixed before the walk (no MIG slots here), and the walk books each card at most
    once, after asking, so booking one card never changes another's answer."""
    cards = walk.cards
    fitting = [
        pos
        for pos in order
        if _first_refusal(_DEFAULT_SELECTION, walk, pos, request) is None
        and _first_refusal(_ROOM, walk, pos, request) is None
    ]
    known = frozenset(fitting)
    position = {cards[pos].index: pos for pos in fitting}
    if len(fitting) <= request.nums or len(position) < len(fitting):  # nothing to choose; a repeated index
        return order, known
    key, card_score = policy.card_key, policy.card_score
    tiers = []
    for pos in fitting:
        card, used_num, used_mem = cards[pos], walk.used_num[pos], walk.used_mem[pos]
        preference = None if key is None else key(card, used_num, used_mem)[0]
        need = _memory_need(card, request, False)
        tiers.append((preference, card_score(used_num + 1, used_mem + need, card.memory, False)))
    first = [position[index] for index in linked_choice(topology, list(position), tiers, request.nums)]
    return first + [pos for pos in order if pos not in first], known


def _memory_need(card: GpuState, request: ContainerRequest, volcano: bool) -> int:
    """Memory a container needs on this card; Volcano's is `uint` (an int32 request wraps)."""
    percentage = request.memory_percentage
    if not volcano:
        return request.memory if percentage is None else card.memory * percentage // 100
    if percentage is None:
        return goint.uint64(request.memory)
    return goint.float_to_uint64(float(goint.uint64(card.memory)) * float(percentage) / 100.0)


def _short_of_memory(card: GpuState, used: int, need: int, volcano: bool) -> bool:
    if volcano:  # int(Memory) - int(UsedMem) < int(memreqForCard), in int64
        free = goint.int64(goint.int64(card.memory) - goint.int64(used))
        return free < goint.int64(need)
    return card.memory - used < need


def _mig_slot(
    card: GpuState, pos: int, request: int, volcano: bool, tentative: dict[int, _MigTentative]
) -> GroupSlot | None:
    assert card.mig is not None
    if volcano:
        return pick_slot_volcano(card.mig, request)
    state = tentative.get(pos)
    if state is None:
        state = tentative[pos] = _MigTentative(card)
    return pick_slot(card.mig, state.used, state.active, request)
