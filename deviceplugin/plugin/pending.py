"""Which pod an Allocate is for (SPEC §3.1 steps 1-4, §3.2): kubelet names only device IDs, so
the pod is resolved from the pods bound to this node, the scheduler's annotations and the ledger.

For a request of N units of a resource the candidates are the pods bound here that the scheduler
has not seen served yet, whose *next* container for the resource (skipping what the ledger has
served) asks for exactly N. Each strategy reads its own annotations into a `PendingPod` with its
own `rank` (`plugin.gpushare`, `plugin.vgpu`), from the steps here that every reader takes (is the
pod `finished`, its `container_needs`, the scheduler's `annotation_time`, `serving_rank`); this
module keeps those pods in serving order, parsed once per change as the pod cache reports it, so
resolving with hundreds of pods on the node stays cheap.

Serving order is kubelet's admission order as far as this node can see it. Kubelet admits the pods
its watch of `spec.nodeName=<node>` delivers one at a time, in the order they became bound; a batch
(its first list after a restart) goes in creation-time order. The daemon's own watch delivers the
same bindings in the same order, so each pod is ranked by when it first appeared there: pods seen
in one list (the daemon's start, a relist) form one group, ordered by creation time; then the
strategy's rank (scheduler time, UID) breaks ties.

A pod that cannot be read (whatever the strategy's reader raises) is no candidate, and one read
with a `problem` stays one so its Allocate answers with the problem; either is reported once to
the pod cache's `rejections` (a log line, a count, an Event where it asks for GPUs) and costs no
other pod anything.
"""

from __future__ import annotations

import bisect
import operator
import threading
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from deviceplugin.fit import objects
from deviceplugin.fit.bounds import parse_decimal
from deviceplugin.fit.errors import AnnotationError, FitInputError
from deviceplugin.fit.quantity import whole_quantity
from deviceplugin.kube.podcache import PodCache
from deviceplugin.kube.rejections import Rejections
from deviceplugin.ledger import NOTHING, Holding, Key

Obj = Mapping[str, object]


@dataclass(frozen=True, slots=True)
class ContainerNeed:
    name: str
    init: bool
    units: int  # kubelet devices of the resource the container asks for


@dataclass(frozen=True, slots=True)
class PendingPod:
    """What matters of a pod for resolution, parsed once per resourceVersion."""

    uid: str
    namespace: str
    name: str
    needs: tuple[ContainerNeed, ...]  # containers still to be served, in kubelet order
    need_keys: tuple[Key, ...]  # the ledger's key per need
    rank: tuple[Any, ...]  # serving order, earliest first; ties broken by creation time and UID
    problem: str = ""  # why the pod cannot be served as written (malformed annotation or quantity)

    @property
    def display(self) -> str:
        return f"{self.namespace}/{self.name}"

    def next_need(self, served: Container[Key]) -> ContainerNeed | None:
        for need, key in zip(self.needs, self.need_keys, strict=True):
            if key not in served:
                return need
        return None

    def containers_left(self, served: Container[Key]) -> int:
        return sum(1 for key in self.need_keys if key not in served)


@dataclass(frozen=True, slots=True)
class Adding:
    """The ledger's keys (`served`) and the one being recorded, without copying them."""

    served: Container[Key]
    key: Key

    def __contains__(self, key: object) -> bool:
        return key == self.key or key in self.served


def finished(pod: Obj) -> bool:
    """Succeeded, Failed or being deleted: kubelet calls no Allocate for it."""
    return objects.is_terminal(pod) or objects.is_terminating(pod)


def container_needs(pod: Obj, resource: str, problems: list[str]) -> Iterator[ContainerNeed]:
    """The need of each container that limits `resource`, in kubelet's order (init containers
    first). A limit that is not a whole number goes to `problems` as the walk reaches it, so a
    caller's own notes on the containers it is given stay in container order."""
    for init, containers in ((True, objects.init_containers(pod)), (False, objects.containers(pod))):
        for container in containers:
            try:
                units = whole_units(container, resource)
            except FitInputError as err:
                problems.append(str(err))
                continue
            if units > 0:
                yield ContainerNeed(objects.container_name(container), init, units)


def serving_rank(later: bool, scheduled_at: int | None, created: str, uid: str) -> tuple[Any, ...]:
    """A candidate's order among those that arrived with it: `later` ones last (not placed, or
    not servable as written), then by the scheduler's time (pods without one after those with),
    creation time and UID."""
    return (later, scheduled_at is None, scheduled_at or 0, created, uid)


def need_keys(uid: str, needs: Iterable[ContainerNeed], resource: str) -> tuple[Key, ...]:
    return tuple((uid, need.name, resource) for need in needs)


def annotation_time(notes: Mapping[str, str], key: str, unit: str, problems: list[str]) -> int | None:
    """A Volcano time annotation (an int64 Unix time in `unit`), None when absent; when it cannot
    be read, None and the reason in `problems`."""
    raw = notes.get(key)
    if raw is None:
        return None
    try:
        return parse_decimal(
            raw,
            key,
            AnnotationError,
            kind=f"a number of {unit}",
            meaning=f"a Unix time in {unit} (Volcano writes an int64)",
        )
    except FitInputError as err:
        problems.append(str(err))
        return None


def whole_units(container: Obj, resource: str) -> int:
    """The container's limit for an extended resource, 0 when absent; FitInputError when it is
    not a whole number."""
    raw = objects.limits(container).get(resource)
    if raw is None:
        return 0
    units = whole_quantity(raw)
    if units is None:
        raise FitInputError(
            f"container {objects.container_name(container)!r}: {resource} {raw!r} is not a whole number"
        )
    return units


def asks_for(pod: Obj, resources: Collection[str]) -> bool:
    """Whether a container of the pod limits one of `resources` (False when its containers cannot
    be read)."""
    try:
        containers = (*objects.init_containers(pod), *objects.containers(pod))
        return any(name in objects.limits(container) for container in containers for name in resources)
    except FitInputError:
        return False


def pod_identity(pod: Obj) -> tuple[str, str, str, str]:
    """UID, namespace, name and creation time."""
    meta = objects.metadata(pod)
    return (
        objects.uid(pod),
        str(meta.get("namespace") or "default"),
        str(meta.get("name") or ""),
        str(meta.get("creationTimestamp") or ""),
    )


P = TypeVar("P", bound=PendingPod)


@dataclass(frozen=True, slots=True)
class Entry(Generic[P]):
    """A candidate in serving order."""

    order: tuple[int, str]  # (arrival group, creation time)
    pod: P

    @property
    def key(self) -> tuple[Any, ...]:
        return (*self.order, self.pod.rank)


Match = tuple[P, ContainerNeed]
KEY = operator.attrgetter("key")


class PendingPods(Generic[P]):
    """The pods that may still need the resource, in serving order, kept from the pod cache's
    events: resolution walks only the candidates, from the earliest, instead of every pod.

    A pod the ledger (`served`, its live view) holds every container of is set aside: from when
    its last container is recorded (`settle`), not from when the scheduler's mark of it comes
    back through the watch, so the pods served meanwhile cost resolution nothing. It comes back
    when rows leave the ledger (`Holding.vacated`: released, or moved to another container) and
    one of its containers is no longer held."""

    def __init__(
        self, parse: Callable[[Obj], P | None], rejections: Rejections, served: Holding = NOTHING
    ) -> None:
        self._read = parse  # None: not a candidate (served, finished, asks for nothing here)
        self._rejections = rejections
        self._served = served
        self._lock = threading.Lock()
        self._by_uid: dict[str, Entry[P]] = {}
        self._ordered: list[Entry[P]] = []  # the values of _by_uid, sorted by key
        self._settled: dict[str, Entry[P]] = {}  # UID -> a candidate whose containers are all held
        self._vacated = served.vacated  # `served.vacated` when `_settled` was last checked
        self._arrival: dict[str, int] = {}  # UID -> arrival group, for every pod on the node
        self._group = 0
        self._listing = True  # the last new pod came from a list, not a watch event

    def follow(self, cache: PodCache) -> None:
        """Start from the cache's pods and follow its changes (the cache calls its listeners
        before it wakes its waiters, so a waiter sees this index already up to date)."""
        cache.add_listener(self.on_pod)
        with self._lock:  # an event racing this start-up waits, then lands on top
            for pod in cache.pods():
                self._update(objects.uid(pod), self._parse(pod), pod, listed=True)

    def on_pod(self, kind: str, pod: Obj) -> None:
        """A watch event, or (`MODIFIED` of a pod never seen) an object of a list."""
        gone = kind == "DELETED"
        parsed = None if gone else self._parse(pod)
        with self._lock:
            self._update(objects.uid(pod), parsed, pod, listed=None if gone else kind != "ADDED")

    def _parse(self, pod: Obj) -> P | None:
        try:
            parsed = self._read(pod)
        except Exception as err:  # malformed, or a bug reading it: this pod alone is left out
            self._rejections.reject(pod, err)
            return None
        if parsed is None or not parsed.needs:
            return None
        if parsed.problem:
            self._rejections.reject(pod, parsed.problem)
        return parsed

    def _arrived(self, uid: str, listed: bool) -> int:
        """The pod's arrival group: a new one per pod a watch brings (its binding), one shared by
        the new pods of a list (whose binding order cannot be told)."""
        group = self._arrival.get(uid)
        if group is None:
            if not listed or not self._listing:
                self._group += 1
            self._listing = listed
            group = self._arrival[uid] = self._group
        return group

    def _update(self, uid: str, parsed: P | None, pod: Obj, *, listed: bool | None) -> None:
        """`listed`: the pod came in a list (True) or a watch event (False); None: it is gone."""
        self._remove(uid)
        self._settled.pop(uid, None)
        if listed is None:
            self._arrival.pop(uid, None)
            return
        group = self._arrived(uid, listed)  # every pod, so one that turns into a candidate keeps it
        if parsed is not None:
            entry = Entry((group, pod_identity(pod)[3]), parsed)
            if parsed.containers_left(self._served):
                self._insert(entry)
            else:
                self._settled[uid] = entry

    def _insert(self, entry: Entry[P]) -> None:
        self._by_uid[entry.pod.uid] = entry
        bisect.insort(self._ordered, entry, key=KEY)

    def _remove(self, uid: str) -> Entry[P] | None:
        entry = self._by_uid.pop(uid, None)
        if entry is not None:
            del self._ordered[bisect.bisect_left(self._ordered, entry.key, key=KEY)]
        return entry

    def __len__(self) -> int:
        """The candidates resolution walks (pods set aside are not)."""
        with self._lock:
            self._unsettle()
            return len(self._ordered)

    def candidate(self, uid: str) -> P | None:
        """The pod as a candidate; None when it is none (or every container is held)."""
        with self._lock:
            entry = self._by_uid.get(uid)
        return None if entry is None else entry.pod

    def settle(self, uid: str) -> None:
        """The ledger recorded a container of the pod: set it aside if it holds every one now."""
        with self._lock:
            entry = self._by_uid.get(uid)
            if entry is not None and not entry.pod.containers_left(self._served):
                self._settled[uid] = entry
                self._remove(uid)

    def _unsettle(self) -> None:
        """Back among the candidates: the pods set aside that lost a row since the last look."""
        vacated = self._served.vacated  # read first: rows leaving during the walk are seen next time
        if vacated == self._vacated:
            return
        self._vacated = vacated
        for uid, entry in list(self._settled.items()):
            if entry.pod.containers_left(self._served):
                del self._settled[uid]
                self._insert(entry)

    def matching(self, served: Container[Key], units: int, limit: int | None = None) -> list[Match[P]]:
        """The candidates (the earliest `limit`, or all) whose next container for the resource
        asks for `units`, earliest first."""
        found: list[Match[P]] = []
        with self._lock:
            self._unsettle()
            for entry in self._ordered:
                need = entry.pod.next_need(served)
                if need is not None and need.units == units:
                    found.append((entry.pod, need))
                    if len(found) == limit:
                        break
        return found

    def first(self, served: Container[Key], units: int) -> Match[P] | None:
        """The earliest candidate whose next container for the resource asks for `units`."""
        with self._lock:
            self._unsettle()
            for entry in self._ordered:
                need = entry.pod.next_need(served)
                if need is not None and need.units == units:
                    return entry.pod, need
        return None
