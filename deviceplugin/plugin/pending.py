"""Which pod an Allocate is for (SPEC §3.1 steps 1-4): kubelet names only device IDs, so the pod
is resolved from the pods bound to this node, the scheduler's annotations and the ledger.

For a request of N units of resource R the candidates are the pods that are bound here, neither
terminating nor finished nor already marked assigned, whose *next* container asking for R (init
containers first, then app containers, skipping what the ledger has served) asks for exactly N.
They are ordered by `volcano.sh/predicate-time`, then creation time, then UID. A pod's parsed
request is kept per resourceVersion, so resolving over hundreds of pods stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from deviceplugin.fit import keys, objects
from deviceplugin.fit.codec import parse_gpu_index
from deviceplugin.fit.errors import FitInputError
from deviceplugin.fit.quantity import parse_quantity

Obj = Mapping[str, object]


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
    problem: str = ""  # why the pod cannot be served as written (malformed annotation or quantity)

    @property
    def display(self) -> str:
        return f"{self.namespace}/{self.name}"

    def next_need(self, served: frozenset[tuple[str, str, str]], resource: str) -> ContainerNeed | None:
        return next((n for n in self.needs if (self.uid, n.name, resource) not in served), None)

    def order(self) -> tuple[bool, int, str, str]:
        return (self.predicate_time is None, self.predicate_time or 0, self.created, self.uid)


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
    return PendingPod(
        uid=objects.uid(pod),
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        needs=tuple(needs),
        eligible=eligible,
        gpu_index=gpu_index,
        predicate_time=predicate_time,
        problem="; ".join(problems),
    )


class PendingPods:
    """Parsed pods for one resource, memoized by (UID, resourceVersion)."""

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self._parsed: dict[str, tuple[str, PendingPod]] = {}

    def parse(self, pod: Obj) -> PendingPod:
        uid, version = objects.uid(pod), str(objects.metadata(pod).get("resourceVersion", ""))
        cached = self._parsed.get(uid)
        if cached is not None and cached[0] == version:
            return cached[1]
        parsed = _parse(pod, self.resource)
        self._parsed[uid] = (version, parsed)
        return parsed

    def candidates(
        self, pods: Iterable[Obj], served: frozenset[tuple[str, str, str]], units: int
    ) -> list[tuple[PendingPod, ContainerNeed]]:
        """Eligible pods whose next container for the resource asks for `units`, in serving order."""
        seen: set[str] = set()
        found = []
        for pod in pods:
            parsed = self.parse(pod)
            seen.add(parsed.uid)
            if not parsed.eligible:
                continue
            need = parsed.next_need(served, self.resource)
            if need is not None and need.units == units:
                found.append((parsed, need))
        for uid in set(self._parsed) - seen:  # pods gone from the node
            del self._parsed[uid]
        # Pods placed by the scheduler (with gpu-index) first; then predicate-time, creation, UID.
        found.sort(key=lambda item: (item[0].gpu_index is None, *item[0].order()))
        return found

    def containers_left(self, pod: PendingPod, served: frozenset[tuple[str, str, str]]) -> int:
        return sum(1 for need in pod.needs if (pod.uid, need.name, self.resource) not in served)
