"""What every strategy's Allocate shares (SPEC §3.3): resolve the pod from the node's pod cache
(see `pending`; among pods asking the same count, `identify`), check kubelet's device IDs,
record the answer in the ledger before it is sent with the patches it calls for queued in the
ledger's outbox (no API request while serving), and turn every failure into a gRPC error naming
the pod, the container and the problem, plus a Kubernetes Event. `plugin.gpushare` and
`plugin.vgpu` supply the placement, the response and what the scheduler books. `reconcile`
corrects, from kubelet's pod-resources records, a pod served as another (`swaps`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol

import grpc

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.fit import objects
from deviceplugin.fit.bounds import shown
from deviceplugin.fit.topology import Topology, best_set
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.health import HealthState
from deviceplugin.kube.events import EventRecorder, Involved
from deviceplugin.kube.podcache import PodCache
from deviceplugin.ledger import Allocation, GpuShare, Key, Ledger, Patch
from deviceplugin.ledgerfiles import CORRUPT, DISK_FULL, StorageError
from deviceplugin.logs import get_log
from deviceplugin.plugin.devices import DeviceList
from deviceplugin.plugin.identify import Identifier
from deviceplugin.plugin.pending import (
    Adding,
    ContainerNeed,
    Obj,
    P,
    PendingPod,
    PendingPods,
    finished,
    pod_identity,
)
from deviceplugin.plugin.podresources import Listing, listable
from deviceplugin.plugin.swaps import (
    apply_moves,
    booking_patches,
    correction_patches,
    describe,
    plan_moves,
    replaced,
)

log = get_log(__name__)

DEFAULT_TIMEOUT_S = 5.0
IDENTIFY_WINDOW = 8  # candidates weighed at once: hundreds of replicas stay cheap to tell apart
UNVERIFIED_PRUNE_MIN = 1024  # rows to check before released ones are first dropped from the set


class AllocateError(Exception):
    """A refused Allocate: the gRPC code, a message for people, a short reason for metrics."""

    def __init__(
        self, code: grpc.StatusCode, reason: str, message: str, pod: PendingPod | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.pod = pod


# The answer to an Allocate the ledger's disk failed: RESOURCE_EXHAUSTED when it is full, DATA_LOSS
# when the file is damaged, UNAVAILABLE when it is read-only or failing (all may pass).
STORAGE_CODES = {DISK_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED, CORRUPT: grpc.StatusCode.DATA_LOSS}


def unstored(err: StorageError, where: str, pod: PendingPod | None = None) -> AllocateError:
    """The refusal of an Allocate the ledger could not record (or read): an answer that is not on
    disk could be handed out twice, so none is given."""
    code = STORAGE_CODES.get(err.problem, grpc.StatusCode.UNAVAILABLE)
    return AllocateError(code, f"ledger-{err.problem}", f"{where}: not served: {err}", pod)


# resource, outcome ("served", "repeat", "empty", "failed"), seconds the call took
LatencyObserver = Callable[[str, str, float], None]
EARLY_KEPT = 10_000  # calls kept for an observer yet to come (a bound, never reached in practice)


@dataclass
class AllocationStats:
    """What the metrics endpoint exports: outcomes per resource, failures per reason, how often
    kubelet's device IDs were not on the GPUs the scheduler chose, what told apart pods asking
    the same count (resource, signal), containers found served as another pod and corrected,
    each call's latency (to the observers: the metrics module keeps the histogram) and the calls
    waiting for their pod."""

    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    mismatches: Counter[str] = field(default_factory=Counter)
    resolved: Counter[tuple[str, str]] = field(default_factory=Counter)
    swaps: Counter[str] = field(default_factory=Counter)
    _observers: list[LatencyObserver] = field(default_factory=list)
    # Calls made before the first observer came (the metrics start after the first Register, and
    # kubelet may call at once), handed to it when it does.
    _early: list[tuple[str, str, float]] = field(default_factory=list)
    _observers_lock: threading.Lock = field(default_factory=threading.Lock)
    _waiting: Counter[str] = field(default_factory=Counter)
    _waiting_lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, resource: str, outcome: str, seconds: float) -> None:
        self.outcomes[(resource, outcome)] += 1
        with self._observers_lock:
            observers = self._observers
            if not observers and len(self._early) < EARLY_KEPT:
                self._early.append((resource, outcome, seconds))
        for observe in observers:
            observe(resource, outcome, seconds)

    def observe_with(self, observer: LatencyObserver) -> None:
        """Send every call's latency to `observer`, beginning with those made before any observer."""
        with self._observers_lock:
            self._observers = [*self._observers, observer]  # a new list: `record` iterates a copy
            early, self._early = self._early, []
        for call in early:
            observer(*call)

    @contextlib.contextmanager
    def waiting_for(self, resource: str) -> Iterator[None]:
        """Counts a call waiting for its pod to reach the pod cache while the block runs."""
        with self._waiting_lock:
            self._waiting[resource] += 1
        try:
            yield
        finally:
            with self._waiting_lock:
                self._waiting[resource] -= 1

    def waiting(self) -> dict[str, int]:
        """Calls waiting for their pod now, by resource."""
        with self._waiting_lock:
            return dict(self._waiting)


class Allocator(Protocol):
    """What the DevicePlugin service needs to answer Allocate and GetPreferredAllocation."""

    def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse: ...

    def preferred(self, request: pb.ContainerPreferredAllocationRequest) -> list[str]: ...


def kubelet_choice(request: pb.ContainerPreferredAllocationRequest, first: Sequence[str] = ()) -> list[str]:
    """`allocation_size` IDs: the must-include ones, then `first`, then kubelet's own order."""
    chosen = dict.fromkeys(request.must_include_deviceIDs)  # an ordered set
    for device_id in itertools.chain(first, request.available_deviceIDs):
        if len(chosen) >= request.allocation_size:
            break
        chosen.setdefault(device_id)
    return list(chosen)


def linked_devices(
    request: pb.ContainerPreferredAllocationRequest, devices: DeviceList, topology: Topology | None
) -> list[str]:
    """For a container the scheduler did not pin: one of kubelet's IDs on each GPU of the
    best-linked set of `allocation_size` GPUs (docs/topology.md), the must-include IDs' GPUs kept,
    the others chosen among the available IDs' GPUs (index order breaks ties, as the extender's
    fit). Empty, so kubelet's own order stands, without a topology, for memory-unit resources
    (a container's memory lives on one GPU) and when the size cannot be met one ID per GPU."""
    size = request.allocation_size
    if topology is None or size < 2 or devices.resource.memory_based:
        return []
    must = list(dict.fromkeys(request.must_include_deviceIDs))
    kept = [gpu.index for gpu in map(devices.gpu_of, must) if gpu is not None]
    if len(set(kept)) < len(must):  # not ours, or two on one GPU
        return []
    free: dict[int, str] = {}
    for device_id in request.available_deviceIDs:
        gpu = devices.gpu_of(device_id)
        if gpu is not None and gpu.index not in kept:
            free.setdefault(gpu.index, device_id)
    wanted = size - len(kept)
    if wanted < 1 or len(free) < wanted:
        return []
    chosen = best_set(topology, sorted(free), wanted, kept)
    return [*must, *(free[index] for index in chosen)]


def _listed(device_ids: Sequence[str]) -> str:
    """The first few IDs for a message, a hostile client's long ones clipped (quoted whole, a 1 MB
    one broke gRPC's status limit)."""
    return ", ".join(d if len(d) <= 64 else shown(d) for d in device_ids[:5])


def check_ids(devices: DeviceList, device_ids: Sequence[str]) -> list[GpuInfo]:
    """The GPU of each of kubelet's device IDs; an AllocateError for none or unknown ones."""
    resource = devices.resource.name
    if not device_ids:
        raise AllocateError(
            grpc.StatusCode.INVALID_ARGUMENT, "empty-request", f"{resource}: Allocate named no device IDs"
        )
    gpus = [devices.gpu_of(device_id) for device_id in device_ids]
    unknown = [d for d, gpu in zip(device_ids, gpus, strict=True) if gpu is None]
    if unknown:
        raise AllocateError(
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown-devices",
            f"{resource}: device IDs {_listed(unknown)} are not devices of this node",
        )
    if len(set(device_ids)) < len(device_ids):  # kubelet never names a device twice: a container
        repeated = [d for d, n in Counter(device_ids).items() if n > 1]  # would be counted twice
        raise AllocateError(
            grpc.StatusCode.INVALID_ARGUMENT,
            "repeated-devices",
            f"{resource}: device IDs {_listed(repeated)} are named more than once",
        )
    return [gpu for gpu in gpus if gpu is not None]


class AccountingAllocator:
    """For resources that only let kubelet account capacity (`vgpu-memory`, `vgpu-cores`): the
    work is done by the `vgpu-number` Allocate of the same container, so each container gets an
    empty response once its IDs are known to be ours."""

    def __init__(self, devices: DeviceList, stats: AllocationStats) -> None:
        self.devices = devices
        self.stats = stats

    def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        started = time.perf_counter()
        resource = self.devices.resource.name
        try:
            check_ids(self.devices, device_ids)
        except AllocateError as err:
            self.stats.failures[err.reason] += 1
            self.stats.record(resource, "failed", time.perf_counter() - started)
            raise
        self.stats.record(resource, "empty", time.perf_counter() - started)
        return pb.ContainerAllocateResponse()

    def preferred(self, request: pb.ContainerPreferredAllocationRequest) -> list[str]:
        return kubelet_choice(request)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one container goes: the candidate pod, its container's need and the GPUs it gets.
    (`served`, elsewhere, holds the ledger's live (pod UID, container, resource) keys.)"""

    pod: PendingPod
    need: ContainerNeed
    gpus: tuple[GpuInfo, ...]


def _finished(pod: Obj | None) -> bool:
    """Gone, terminal or terminating: kubelet will call no Allocate for it."""
    return pod is None or finished(pod)


def as_written(pod: Obj, annotations: Mapping[str, str]) -> Obj:
    """A copy of `pod` with these annotations and no deletion mark: the pod as the scheduler left
    it, before this node served any of its containers (see `PodAllocator.rebuilt`)."""
    meta = {key: value for key, value in objects.metadata(pod).items() if key != "deletionTimestamp"}
    return {**pod, "metadata": {**meta, "annotations": dict(annotations)}}


class PodAllocator(Generic[P]):
    """Serves one resource whose Allocate is matched to a pod. Subclasses say where the pod's
    GPUs are (`_placement`), what the container gets (`_response`, `_shares`), which patches
    follow (`_patches`, `_failure_patches`) and what the scheduler books for a pod (`_booking`)."""

    lock_key = ""  # the scheduler's node lock annotation, released after a pod and on failure
    pod_specific = False  # responses name the pod: same-placement candidates still differ

    def __init__(
        self,
        devices: DeviceList,
        health: HealthState,
        pods: PodCache,
        ledger: Ledger,
        events: EventRecorder,
        *,
        node_name: str,
        id_strategy: str = "uuid",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        stats: AllocationStats | None = None,
        on_outbox: Callable[[], None] = lambda: None,
        pod_resources: Path | None = None,
        topology: Topology | None = None,
    ) -> None:
        self.devices = devices
        self.topology = topology  # how the node's GPUs connect, for containers the scheduler did not pin
        self.resource = devices.resource.name
        self.health = health
        self.pods = pods
        self.ledger = ledger
        self.events = events
        self.node_name = node_name
        self.id_strategy = id_strategy
        self.timeout_s = timeout_s
        self.stats = stats or AllocationStats()
        self.on_outbox = on_outbox  # patches were queued: the outbox worker can send them now
        self.pending: PendingPods[P] = PendingPods(self._read_pod, pods.rejections, ledger.holding)
        self.pending.follow(pods)
        self.identifier = Identifier(self.resource, pod_resources, self.stats.resolved)
        self._siblings = ledger.containers_held_except(self.resource)  # a live view, asked per call
        # Rows kubelet's records have yet to confirm: those recorded when the pod could not be told
        # apart from another, and every later one while any is left (the next pod asking the same
        # count may be the one the first was taken for). Rows from before a restart are checked once.
        # Kept as rows are recorded; keys of released rows leave when `unverified` or `reconcile`
        # next looks (until then a row recorded is checked once more than it needs), or when the set
        # has doubled since they last left (nobody looks without kubelet's pod-resources socket).
        self._unverified = {key for key in ledger.served() if key[2] == self.resource}
        self._unverified_lock = threading.Lock()  # the release loop reads it without `_lock`
        self._prune_at = UNVERIFIED_PRUNE_MIN  # size at which released keys are next dropped
        self._by_index = {gpu.index: gpu for gpu in devices.gpus}
        self._lock = threading.Lock()  # one resolution at a time: no pod is served twice

    # --- what a strategy supplies ---------------------------------------------------------------

    def _read_pod(self, pod: Obj) -> P | None:
        """The pod as a candidate; None when it is not one (finished, served, not ours)."""
        raise NotImplementedError

    def _placement(self, pod: P, need: ContainerNeed, kubelet_gpus: Sequence[GpuInfo]) -> Placement:
        raise NotImplementedError

    def _response(self, placement: Placement) -> pb.ContainerAllocateResponse:
        raise NotImplementedError

    def _shares(self, placement: Placement) -> tuple[GpuShare, ...]:
        raise NotImplementedError

    def _patches(self, placement: Placement, done: Container[Key]) -> list[Patch]:
        """Patches to queue with the allocation; `done`: the ledger's keys, this container's included."""
        raise NotImplementedError

    def _failure_patches(self, pod: PendingPod | None) -> list[Patch]:
        return [self._unlock()]

    def _prepare(self, placement: Placement) -> None:
        """Make on the host what the response names (before it is recorded and sent)."""

    def _as_written(self, pod: Obj) -> Obj:
        """The pod as the scheduler left it, before this node served any of its containers
        (`as_written`): what the strategy's annotations said before serving changed them."""
        raise NotImplementedError

    def _asking(self, units: int) -> str:
        """What a request of `units` devices asks for, in words."""
        return f"{units} {self.resource}"

    def _booking(self, pod: Obj, rows: Sequence[Allocation]) -> Mapping[str, str] | None:
        """The annotations the scheduler books `pod` by, as `rows` (the pod's live rows, every
        resource) say it is served; None when that cannot be told yet."""
        return None

    # --- shared parts ---------------------------------------------------------------------------

    def _unlock(self) -> Patch:
        return Patch("node", "", self.node_name, {self.lock_key: None})

    def _resolve(
        self, units: int, served: Container[Key], deadline: float
    ) -> tuple[P, ContainerNeed, bool] | None:
        """The pod and container this request is for, and whether it was the only candidate or
        kubelet's records told it; None while no pod asks for it and the deadline is ahead (the
        caller waits for one, `_await_candidate`); an AllocateError after the deadline."""
        match = self._identify(units, served, deadline, keep=False)
        if match is not None or time.monotonic() < deadline:
            return match
        what = self._asking(units)
        if not self.pods.synced:
            raise AllocateError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "api-unavailable",
                f"node {self.node_name}: cannot tell which pod asks for {what}: the pod cache has not heard "
                f"from the API server for {self.pods.staleness_s():.0f}s",
            )
        raise AllocateError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "no-pod",
            f"node {self.node_name}: no pod bound here has a container waiting for {what} "
            f"(waited {self.timeout_s:g}s; {len(self.pods.pods())} pod(s) on the node)",
        )

    def _candidate(self, units: int) -> tuple[P, ContainerNeed, bool] | None:
        """The pod a GetPreferredAllocation is for, waited for (bounded) as Allocate waits: kubelet
        may admit a pod before this node's watch brings it, and an answer given without the pod
        would steer kubelet's records away from the GPUs the scheduler chose."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            with self._lock:
                found = self._identify(units, self.ledger.holding, deadline, keep=True)
            if found or time.monotonic() >= deadline:
                return found
            self._await_candidate(units, deadline)

    def _await_candidate(self, units: int, deadline: float) -> None:
        """Wait (bounded) for the cache to bring a pod asking `units`, without the lock: the
        Allocates of pods already cached are served meanwhile."""
        with self.stats.waiting_for(self.resource):
            self.pods.wait_until(
                lambda _: self.pending.first(self.ledger.holding, units) is not None,
                max(0.0, deadline - time.monotonic()),
            )

    def _reusing(
        self, row: Allocation, served: Container[Key], units: int
    ) -> tuple[P, ContainerNeed, bool] | None:
        """The pod's next container when `row` is a run-to-completion init container's: kubelet
        hands its devices to the pod's later containers first, so one asking as many sends the
        same IDs in its own Allocate (not a repeat)."""
        pod = self.pods.get(row.pod_uid)
        if pod is None or listable(pod, row.container):
            return None
        for candidate, need in self.pending.matching(served, units):
            if candidate.uid == row.pod_uid:
                return candidate, need, True
        return None

    def _identify(
        self, units: int, served: Container[Key], deadline: float, *, keep: bool
    ) -> tuple[P, ContainerNeed, bool] | None:
        """The candidate kubelet is admitting among those asking `units` (`identify`): kubelet
        admits in the order the daemon ranks pods but for the odd refused pod or batch, so the
        earliest few are weighed first, the rest only when none of those is the one."""
        window = self.pending.matching(served, units, limit=IDENTIFY_WINDOW)
        if not window:
            return None
        distinct = self.pod_specific or self._differ(window)
        (pod, need), sure = self.identifier.pick(
            window,
            self._siblings,  # a container served for another resource
            deadline,
            distinct=distinct,
            keep=keep,
            more=lambda: self.pending.matching(served, units)[IDENTIFY_WINDOW:],
        )
        return pod, need, sure

    def _differ(self, window: Sequence[tuple[P, ContainerNeed]]) -> bool:
        """Whether the candidates would not all get the same; stops at the first that differs
        (share pods alternate GPUs: two placements, not eight, per Allocate)."""
        first = self._outcome(*window[0])
        return any(self._outcome(pod, need) != first for pod, need in window[1:])

    def _outcome(self, pod: P, need: ContainerNeed) -> object:
        """What serving the need hands out, to tell candidates apart (a refusal is its own)."""
        try:
            return self._shares(self._placement(pod, need, ()))
        except AllocateError:
            return pod.uid

    def _usable(self, gpu: GpuInfo, where: str, named: str) -> GpuInfo:
        """`gpu` if healthy; `named` says how the pod named it."""
        if not self.health.snapshot()[1].get(gpu.uuid, False):
            raise AllocateError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "gpu-unhealthy",
                f"{where}: {named} names GPU {gpu.index} ({gpu.uuid}), which is unhealthy",
            )
        return gpu

    def _visible(self, gpus: Sequence[GpuInfo]) -> str:
        return ",".join(gpu.uuid if self.id_strategy == "uuid" else str(gpu.index) for gpu in gpus)

    def _note_mismatch(self, placement: Placement, kubelet_gpus: Sequence[GpuInfo]) -> None:
        if {g.uuid for g in kubelet_gpus} <= {g.uuid for g in placement.gpus}:
            return
        self.stats.mismatches[self.resource] += 1
        kubelet_chose = sorted({g.index for g in kubelet_gpus})
        message = (
            f"kubelet assigned {self.resource} IDs on GPU(s) {kubelet_chose} to container "
            f"{placement.need.name!r}, the scheduler chose {[g.index for g in placement.gpus]}; "
            "serving the scheduler's choice"
        )
        log.warning("device ids do not match the scheduler's gpus", pod=placement.pod.display, detail=message)
        self.events.warning(self._involved(placement.pod), "GpuIdsMismatch", message)

    def _involved(self, pod: PendingPod) -> Involved:
        return Involved("Pod", pod.name, pod.namespace, pod.uid)

    # --- RPCs -----------------------------------------------------------------------------------

    def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        """Serve one container; raises `AllocateError` (after an Event) when it cannot."""
        started = time.perf_counter()
        try:
            response, outcome = self._allocate(device_ids, time.monotonic() + self.timeout_s)
        except StorageError as err:  # a read of the ledger on the way
            refusal = unstored(err, f"node {self.node_name}")
            self._failed(refusal)
            self.stats.record(self.resource, "failed", time.perf_counter() - started)
            raise refusal from err
        except AllocateError as err:
            self._failed(err)
            self.stats.record(self.resource, "failed", time.perf_counter() - started)
            raise
        self.stats.record(self.resource, outcome, time.perf_counter() - started)
        return response

    def _allocate(
        self, device_ids: Sequence[str], deadline: float
    ) -> tuple[pb.ContainerAllocateResponse, str]:
        kubelet_gpus = check_ids(self.devices, device_ids)
        while (answer := self._serve(device_ids, kubelet_gpus, deadline)) is None:
            self._await_candidate(len(device_ids), deadline)
        return answer

    def _serve(
        self, device_ids: Sequence[str], kubelet_gpus: Sequence[GpuInfo], deadline: float
    ) -> tuple[pb.ContainerAllocateResponse, str] | None:
        """The answer and its outcome; None when no pod asks for the IDs yet (see `_resolve`)."""
        with self._lock:
            served = self.ledger.holding  # live: a row released meanwhile is a pod's that is gone
            repeat = self.ledger.find_by_devices(self.resource, device_ids)
            reuse = None if repeat is None else self._reusing(repeat, served, len(device_ids))
            if repeat is not None and reuse is None:
                return pb.ContainerAllocateResponse.FromString(repeat.response), "repeat"
            found = reuse or self._resolve(len(device_ids), served, deadline)
            if found is None:
                return None
            pod, need, sure = found
            try:
                placement = self._placement(pod, need, kubelet_gpus)
            except AllocateError as err:
                err.pod = err.pod or pod
                raise
            response = self._response(placement)
            self._prepare(placement)
            key = (pod.uid, need.name, self.resource)
            done = Adding(served, key)
            complete = pod.containers_left(done) == 0
            patches = self._patches(placement, done)
            shares = self._shares(placement)  # none: an answer that only lets kubelet account
            try:
                self.ledger.record(
                    Allocation(
                        pod_uid=pod.uid,
                        namespace=pod.namespace,
                        pod_name=pod.name,
                        container=need.name,
                        resource=self.resource,
                        gpus=shares,
                        device_ids=tuple(device_ids),
                        response=response.SerializeToString(),
                    ),
                    patches,
                )
            except StorageError as err:
                raise unstored(err, f"pod {pod.display} container {need.name!r}", pod) from err
            if complete:
                self.pending.settle(pod.uid)
            if not sure or self._unverified:
                self._note_unverified(key)
        if patches:
            self.on_outbox()
        self._note_mismatch(placement, kubelet_gpus)
        log.info(
            "allocated",
            resource=self.resource,
            pod=pod.display,
            container=need.name,
            gpus=",".join(str(g.index) for g in placement.gpus),
            pod_complete=complete,
        )
        return response, "served" if shares else "empty"

    def _failed(self, err: AllocateError) -> None:
        self.stats.failures[err.reason] += 1
        log.error("allocate failed", resource=self.resource, reason=err.reason, error=str(err))
        about = self._involved(err.pod) if err.pod else Involved.node(self.node_name, uid=self.node_name)
        self.events.warning(about, "GpuAllocationFailed", str(err))
        patches = self._failure_patches(err.pod)
        try:
            self.ledger.enqueue(patches)
        except StorageError as unwritten:  # Volcano's node lock then lasts until it expires
            log.error("failure patches not queued", patches=repr(patches), error=str(unwritten))
            return
        self.on_outbox()

    def preferred(self, request: pb.ContainerPreferredAllocationRequest) -> list[str]:
        """Device IDs on the GPU(s) the scheduler chose, so kubelet's own records name them; for a
        container it did not pin (no pod found, no choice on it) the best-linked GPUs
        (`linked_devices`). Best effort: never an error (kubelet falls back to its own choice on
        a short answer)."""
        wanted: tuple[str, ...] = ()
        found = self._candidate(request.allocation_size)
        if found:
            pod, need, _ = found
            with contextlib.suppress(AllocateError):  # Allocate will report it
                wanted = self.devices.id_prefixes(gpu.index for gpu in self._placement(pod, need, ()).gpus)
        available = request.available_deviceIDs  # 160,000 IDs and more in share mode
        if not wanted:
            return kubelet_choice(request, linked_devices(request, self.devices, self.topology))
        return kubelet_choice(request, [device_id for device_id in available if device_id.startswith(wanted)])

    # --- detection and correction ---------------------------------------------------------------

    def _note_unverified(self, key: Key) -> None:
        """Add a row to check; drop released ones each time the set doubles, so that it stays
        bounded by the live rows when nobody asks `unverified` (no pod-resources socket)."""
        with self._unverified_lock:
            self._unverified.add(key)
            if len(self._unverified) >= self._prune_at:
                self._drop_released()
                self._prune_at = max(UNVERIFIED_PRUNE_MIN, 2 * len(self._unverified))

    def _drop_released(self) -> None:
        """Keep only the rows to check that the ledger still holds (caller holds `_unverified_lock`)."""
        self._unverified = {key for key in self._unverified if key in self.ledger.holding}

    def unverified(self) -> frozenset[Key]:
        """Rows that may be held by another container than the ledger says (without `_lock`: the
        release loop asks from the pod cache's thread, which an Allocate may be waiting on)."""
        with self._unverified_lock:
            self._drop_released()
            return frozenset(self._unverified)

    def _awaited(self, listing: Listing, pods: Iterable[Obj]) -> bool:
        """Kubelet lists a container that asks for the resource and holds none of it yet: an
        Allocate answer may be on its way to it, its device IDs not in the records yet."""
        for pod in pods:
            namespace, name = pod_identity(pod)[1:3]
            if (namespace, name) not in listing.pods:
                continue
            for container in (*objects.init_containers(pod), *objects.containers(pod)):
                named = objects.container_name(container)
                if (
                    self.resource in objects.limits(container)
                    and listing.lists(namespace, name, named)
                    and self.resource not in listing.holding(namespace, name, named)
                ):
                    return True
        return False

    def reconcile(self, listing: Listing) -> int:
        """Checks the rows kubelet's records have yet to confirm (nothing to do when none): a row
        whose device IDs kubelet lists under another container goes to that container (`swaps`);
        what the scheduler books for the pods involved is corrected through the outbox, and each
        pod whose container got another pod's placement gets an Event and is counted. Returns the
        rows moved."""
        with self._lock:
            with self._unverified_lock:
                unverified = set(self._unverified)
            if not unverified:
                return 0
            rows = self.ledger.active()
            mine = {(r.pod_uid, r.container, r.resource): r for r in rows if r.resource == self.resource}
            pods = {objects.uid(pod): pod for pod in self.pods.pods()}
            uids = {pod_identity(pod)[1:3]: uid for uid, pod in pods.items()}
            plan = plan_moves(
                (mine[key] for key in unverified if key in mine),
                mine.keys(),
                listing,
                lambda namespace, name: uids.get((namespace, name)),
                lambda uid: _finished(pods.get(uid)),
                settled=lambda: not self._awaited(listing, pods.values()),
            )
            unverified = {
                key
                for key in unverified
                if key in mine and key not in plan.confirmed and listable(pods.get(key[0]) or {}, key[1])
            }
            if plan.moves:
                after = apply_moves(rows, plan.moves)
                patches = correction_patches(after, plan.moves, pods, self._booking)
                self.ledger.reassign(plan.moves, patches)
                unverified -= {key for move in plan.moves for key in (move.key, move.new_key)}
                for move in plan.moves:  # the pod a row went to may hold every container now
                    self.pending.settle(move.pod_uid)
            with self._unverified_lock:  # rows recorded meanwhile: none, the lock is held
                self._unverified = unverified
            if not plan.moves:
                return 0
        if patches:
            self.on_outbox()
        for move, row in replaced(rows, plan.moves):
            self.stats.swaps[self.resource] += 1
            message = describe(move, row, patches)
            log.warning("served as another pod", pod=f"{move.namespace}/{move.pod_name}", detail=message)
            about = Involved("Pod", move.pod_name, move.namespace, move.pod_uid)
            self.events.warning(about, "GpuAllocationSwapped", message)
        return len(plan.moves)

    # --- rebuilding a lost ledger -----------------------------------------------------------------

    def rebuilt(self, pod: Obj, container: str, device_ids: Sequence[str]) -> Allocation:
        """The row this node's Allocate recorded for `container` of `pod`, which kubelet holds
        `device_ids` for: served again from the pod as the scheduler left it (`_as_written`), with
        nothing made on the host and nothing queued. AllocateError when the pod does not say."""
        where = f"pod {pod_identity(pod)[1]}/{pod_identity(pod)[2]} container {container!r}"
        try:
            kubelet_gpus = check_ids(self.devices, device_ids)
        except AllocateError as err:
            raise AllocateError(err.code, err.reason, f"{where}: {err}") from None
        candidate = self._read_pod(self._as_written(pod))
        need = None if candidate is None else next((n for n in candidate.needs if n.name == container), None)
        if candidate is None or need is None:
            raise AllocateError(
                grpc.StatusCode.NOT_FOUND,
                "not-placed",
                f"{where}: the pod's annotations place no {self.resource} for it on node {self.node_name}",
            )
        placement = self._placement(candidate, need, kubelet_gpus)
        return Allocation(
            pod_uid=candidate.uid,
            namespace=candidate.namespace,
            pod_name=candidate.name,
            container=need.name,
            resource=self.resource,
            gpus=self._shares(placement),
            device_ids=tuple(device_ids),
            response=self._response(placement).SerializeToString(),
        )

    def rebuild(self, listing: Listing) -> tuple[list[Allocation], list[str]]:
        """For a ledger lost to corruption: records the row of each container kubelet's `listing`
        shows holding devices of the resource (`rebuilt`; a row already there stays), and queues
        what the scheduler books for their pods, as after a swap. Returns the rows and, for each
        container that cannot come back, why."""
        pods = {pod_identity(pod)[1:3]: pod for pod in self.pods.pods()}
        rows: list[Allocation] = []
        lost: list[str] = []
        with self._lock:
            for (namespace, name), listed in listing.pods.items():
                for container in listed.containers:
                    device_ids = listing.holding(namespace, name, container.name).get(self.resource)
                    if not device_ids:
                        continue
                    pod = pods.get((namespace, name))
                    if pod is None:
                        lost.append(
                            f"pod {namespace}/{name} container {container.name!r}: the API server binds no "
                            f"such pod to node {self.node_name}"
                        )
                        continue
                    try:
                        row = self.rebuilt(pod, container.name, sorted(device_ids))
                    except AllocateError as err:
                        lost.append(str(err))
                        continue
                    rows.append(self.ledger.record(row))
            by_uid = {objects.uid(pod): pod for pod in pods.values()}
            patches = booking_patches(
                dict.fromkeys(row.pod_uid for row in rows), self.ledger.active(), by_uid, self._booking
            )
            self.ledger.enqueue(patches)
        if patches:
            self.on_outbox()
        return rows, lost
