"""Which pod an Allocate is for (SPEC §3.1 steps 1-4): kubelet names only device IDs, so the pod
is resolved from the pods bound to this node, the scheduler's annotations and the ledger.

For a request of N units of resource R the candidates are the pods that are bound here, neither
terminating nor finished nor already marked assigned, whose *next* container asking for R (init
containers first, then app containers, skipping what the ledger has served) asks for exactly N.
Pods placed by the scheduler (with `volcano.sh/gpu-index`) come first, then they are ordered by
`volcano.sh/predicate-time`, creation time and UID. Pods are parsed once per change, as the pod
cache reports it, and kept in that order, so resolving with hundreds of pods on the node stays
cheap.
"""

from __future__ import annotations

import bisect
import operator
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from deviceplugin.fit import keys, objects
from deviceplugin.fit.codec import parse_gpu_index
from deviceplugin.fit.errors import FitInputError
from deviceplugin.fit.quantity import parse_quantity
from deviceplugin.kube.podcache import PodCache
from deviceplugin.logs import get_log

log = get_log(__name__)

Obj = Mapping[str, object]
RANK = operator.attrgetter("rank")


@dataclass(frozen=True, slots=True)
class ContainerNeed:
    name: str
    init: bool
    units: int


@dataclass(frozen=True, slots=True)
class PendingPod:
    """What matters of a pod for resolution, parsed once per resourceVersion."""

    uid: str
    namespace: str
    name: str
    created: str
    needs: tuple[ContainerNeed, ...]  # containers asking for the resource, in kubelet order
    eligible: bool  # bound, not terminating, not finished, not already assigned
    gpu_index: tuple[int, ...] | None  # None: the annotation is absent
    predicate_time: int | None  # None: absent or unreadable
    need_keys: tuple[tuple[str, str, str], ...]  # the ledger's (uid, container, resource) per need
    problem: str = ""  # why the pod cannot be served as written (malformed annotation or quantity)
    # Serving order: pods placed by the scheduler (with gpu-index) first, then predicate-time,
    # creation time and UID. Derived; kept because resolution compares it for every pod.
    rank: tuple[bool, bool, int, str, str] = field(init=False)

    def __post_init__(self) -> None:
        rank = (self.gpu_index is None, self.predicate_time is None, self.predicate_time or 0)
        object.__setattr__(self, "rank", (*rank, self.created, self.uid))

    @property
    def display(self) -> str:
        return f"{self.namespace}/{self.name}"

    def next_need(self, served: frozenset[tuple[str, str, str]]) -> ContainerNeed | None:
        for need, key in zip(self.needs, self.need_keys, strict=True):
            if key not in served:
                return need
        return None


def _units(container: Obj, resource: str) -> int:
    raw = objects.limits(container).get(resource)
    if raw is None:
        return 0
    amount = parse_quantity(raw)
    if amount < 0 or amount.denominator != 1:
        raise FitInputError(
            f"container {objects.container_name(container)!r}: {resource} {raw!r} is not a whole number"
        )
    return amount.numerator


def _parse(pod: Obj, resource: str) -> PendingPod:
    meta = objects.metadata(pod)
    notes = objects.annotations_of(pod)
    problems: list[str] = []
    needs: list[ContainerNeed] = []
    for init, containers in ((True, objects.init_containers(pod)), (False, objects.containers(pod))):
        for container in containers:
            try:
                units = _units(container, resource)
            except FitInputError as err:
                problems.append(str(err))
                continue
            if units > 0:
                needs.append(ContainerNeed(objects.container_name(container), init, units))
    gpu_index: tuple[int, ...] | None = None
    if keys.GPU_INDEX in notes:
        try:
            gpu_index = tuple(parse_gpu_index(notes[keys.GPU_INDEX]))
        except FitInputError as err:
            problems.append(f"{keys.GPU_INDEX}: {err}")
    predicate_time: int | None = None
    raw_time = notes.get(keys.PREDICATE_TIME)
    if raw_time is not None:
        if raw_time.isascii() and raw_time.isdigit():
            predicate_time = int(raw_time)
        else:
            problems.append(f"{keys.PREDICATE_TIME} {raw_time!r} is not a number of nanoseconds")
    eligible = not (
        objects.is_terminal(pod) or meta.get("deletionTimestamp") or notes.get(keys.GPU_ASSIGNED) == "true"
    )
    uid = objects.uid(pod)
    return PendingPod(
        uid=uid,
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        needs=tuple(needs),
        eligible=eligible,
        gpu_index=gpu_index,
        predicate_time=predicate_time,
        problem="; ".join(problems),
        need_keys=tuple((uid, need.name, resource) for need in needs),
    )


class PendingPods:
    """The pods that may still need the resource, in serving order, kept from the pod cache's
    events: resolution walks only the candidates, from the earliest, instead of every pod."""

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self._lock = threading.Lock()
        self._by_uid: dict[str, PendingPod] = {}
        self._ordered: list[PendingPod] = []  # the values of _by_uid, sorted by rank

    def follow(self, cache: PodCache) -> None:
        """Start from the cache's pods and follow its changes (the cache calls its listeners
        before it wakes its waiters, so a waiter sees this index already up to date)."""
        cache.add_listener(self.on_pod)
        with self._lock:  # an event racing this start-up waits, then lands on top
            for pod in cache.pods():
                self._update(objects.uid(pod), self._parse(pod))

    def on_pod(self, kind: str, pod: Obj) -> None:
        parsed = None if kind == "DELETED" else self._parse(pod)
        with self._lock:
            self._update(objects.uid(pod), parsed)

    def _parse(self, pod: Obj) -> PendingPod | None:
        try:
            parsed = _parse(pod, self.resource)
        except FitInputError as err:  # not a pod the API server would hold: ignore it, loudly
            log.warning("pod unreadable", pod=objects.namespaced_name(pod), error=str(err))
            return None
        return parsed if parsed.eligible and parsed.needs else None

    def _update(self, uid: str, parsed: PendingPod | None) -> None:
        old = self._by_uid.pop(uid, None)
        if old is not None:
            del self._ordered[bisect.bisect_left(self._ordered, old.rank, key=RANK)]
        if parsed is not None:
            self._by_uid[uid] = parsed
            bisect.insort(self._ordered, parsed, key=RANK)

    def first(
        self, served: frozenset[tuple[str, str, str]], units: int
    ) -> tuple[PendingPod, ContainerNeed] | None:
        """The earliest candidate (`PendingPod.rank`) whose next container for the resource asks
        for `units`."""
        with self._lock:
            for pod in self._ordered:
                need = pod.next_need(served)
                if need is not None and need.units == units:
                    return pod, need
        return None

    def containers_left(self, pod: PendingPod, served: frozenset[tuple[str, str, str]]) -> int:
        return sum(1 for key in pod.need_keys if key not in served)
