"""What every strategy's Allocate shares (SPEC §3.3): resolve the pod from the node's pod cache
(see `pending`), check kubelet's device IDs, record the answer in the ledger before it is sent
with the patches it calls for queued in the ledger's outbox (no API request while serving), and
turn every failure into a gRPC error naming the pod, the container and the problem, plus a
Kubernetes Event. `plugin.gpushare` and `plugin.vgpu` supply the placement and the response.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol

import grpc

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.health import HealthState
from deviceplugin.kube.events import EventRecorder, Involved
from deviceplugin.kube.podcache import PodCache
from deviceplugin.ledger import Allocation, GpuShare, Key, Ledger, Patch
from deviceplugin.logs import get_log
from deviceplugin.plugin.devices import DeviceList
from deviceplugin.plugin.pending import ContainerNeed, Obj, P, PendingPod, PendingPods

log = get_log(__name__)

DEFAULT_TIMEOUT_S = 5.0


class AllocateError(Exception):
    """A refused Allocate: the gRPC code, a message for people, a short reason for metrics."""

    def __init__(
        self, code: grpc.StatusCode, reason: str, message: str, pod: PendingPod | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.pod = pod


# resource, outcome ("served", "repeat", "empty", "failed"), seconds the call took
LatencyObserver = Callable[[str, str, float], None]


@dataclass
class AllocationStats:
    """What the metrics endpoint exports: outcomes per resource, failures per reason, how often
    kubelet's device IDs were not on the GPUs the scheduler chose, and each call's latency (to
    the observers: the metrics module keeps the histogram)."""

    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    mismatches: Counter[str] = field(default_factory=Counter)
    observers: list[LatencyObserver] = field(default_factory=list)

    def record(self, resource: str, outcome: str, seconds: float) -> None:
        self.outcomes[(resource, outcome)] += 1
        for observe in self.observers:
            observe(resource, outcome, seconds)


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
            f"{resource}: device IDs {', '.join(unknown[:5])} are not devices of this node",
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
class Served:
    pod: PendingPod
    need: ContainerNeed
    gpus: tuple[GpuInfo, ...]


class PodAllocator(Generic[P]):
    """Serves one resource whose Allocate is matched to a pod. Subclasses say where the pod's
    GPUs are (`_placement`), what the container gets (`_response`, `_shares`) and which patches
    follow (`_patches`, `_failure_patches`)."""

    lock_key = ""  # the scheduler's node lock annotation, released after a pod and on failure

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
    ) -> None:
        self.devices = devices
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
        self.pending: PendingPods[P] = PendingPods(self._read_pod)
        self.pending.follow(pods)
        self._by_index = {gpu.index: gpu for gpu in devices.gpus}
        self._lock = threading.Lock()  # one resolution at a time: no pod is served twice

    # --- what a strategy supplies ---------------------------------------------------------------

    def _read_pod(self, pod: Obj) -> P | None:
        """The pod as a candidate; None when it is not one (finished, served, not ours)."""
        raise NotImplementedError

    def _placement(self, pod: P, need: ContainerNeed, kubelet_gpus: Sequence[GpuInfo]) -> Served:
        raise NotImplementedError

    def _response(self, served: Served) -> pb.ContainerAllocateResponse:
        raise NotImplementedError

    def _shares(self, served: Served) -> tuple[GpuShare, ...]:
        raise NotImplementedError

    def _patches(self, served: Served, done: frozenset[Key]) -> list[Patch]:
        """Patches to queue with the allocation; `done`: the ledger's keys, this container's included."""
        raise NotImplementedError

    def _failure_patches(self, pod: PendingPod | None) -> list[Patch]:
        return [self._unlock()]

    def _asking(self, units: int) -> str:
        """What a request of `units` devices asks for, in words."""
        return f"{units} {self.resource}"

    # --- shared parts ---------------------------------------------------------------------------

    def _unlock(self) -> Patch:
        return Patch("node", "", self.node_name, {self.lock_key: None})

    def _resolve(self, units: int, served: frozenset[Key], deadline: float) -> tuple[P, ContainerNeed]:
        """The pod and container this request is for, waiting (bounded) for the cache."""
        match = self.pending.first(served, units)
        if match is None:
            self.pods.wait_until(
                lambda _: self.pending.first(served, units) is not None, max(0.0, deadline - time.monotonic())
            )
            match = self.pending.first(served, units)
        if match is not None:
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

    def _note_mismatch(self, served: Served, kubelet_gpus: Sequence[GpuInfo]) -> None:
        if {g.uuid for g in kubelet_gpus} <= {g.uuid for g in served.gpus}:
            return
        self.stats.mismatches[self.resource] += 1
        kubelet_chose = sorted({g.index for g in kubelet_gpus})
        message = (
            f"kubelet assigned {self.resource} IDs on GPU(s) {kubelet_chose} to container "
            f"{served.need.name!r}, the scheduler chose {[g.index for g in served.gpus]}; "
            "serving the scheduler's choice"
        )
        log.warning("device ids do not match the scheduler's gpus", pod=served.pod.display, detail=message)
        self.events.warning(self._involved(served.pod), "GpuIdsMismatch", message)

    def _involved(self, pod: PendingPod) -> Involved:
        return Involved("Pod", pod.name, pod.namespace, pod.uid)

    # --- RPCs -----------------------------------------------------------------------------------

    def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        """Serve one container; raises `AllocateError` (after an Event) when it cannot."""
        started = time.perf_counter()
        try:
            response, outcome = self._allocate(device_ids, time.monotonic() + self.timeout_s)
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
        with self._lock:
            repeat = self.ledger.find_by_devices(self.resource, device_ids)
            if repeat is not None:
                return pb.ContainerAllocateResponse.FromString(repeat.response), "repeat"
            served_keys = self.ledger.served()  # unchanged while the lock is held
            pod, need = self._resolve(len(device_ids), served_keys, deadline)
            try:
                served = self._placement(pod, need, kubelet_gpus)
            except AllocateError as err:
                err.pod = err.pod or pod
                raise
            response = self._response(served)
            done = served_keys | {(pod.uid, need.name, self.resource)}
            complete = pod.containers_left(done) == 0
            patches = self._patches(served, done)
            shares = self._shares(served)  # none: an answer that only lets kubelet account
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
        if patches:
            self.on_outbox()
        self._note_mismatch(served, kubelet_gpus)
        log.info(
            "allocated",
            resource=self.resource,
            pod=pod.display,
            container=need.name,
            gpus=",".join(str(g.index) for g in served.gpus),
            pod_complete=complete,
        )
        return response, "served" if shares else "empty"

    def _failed(self, err: AllocateError) -> None:
        self.stats.failures[err.reason] += 1
        log.error("allocate failed", resource=self.resource, reason=err.reason, error=str(err))
        about = self._involved(err.pod) if err.pod else Involved.node(self.node_name, uid=self.node_name)
        self.events.warning(about, "GpuAllocationFailed", str(err))
        self.ledger.enqueue(self._failure_patches(err.pod))
        self.on_outbox()

    def preferred(self, request: pb.ContainerPreferredAllocationRequest) -> list[str]:
        """Device IDs on the GPU(s) the scheduler chose, so kubelet's own records name them.
        Best effort: never an error (kubelet falls back to its own choice on a short answer)."""
        wanted: tuple[str, ...] = ()
        with self._lock:
            found = self.pending.first(self.ledger.served(), request.allocation_size)
        if found:
            pod, need = found
            with contextlib.suppress(AllocateError):  # Allocate will report it
                wanted = self.devices.id_prefixes(gpu.index for gpu in self._placement(pod, need, ()).gpus)
        available = request.available_deviceIDs  # 160,000 IDs and more in share mode
        on_wanted = [device_id for device_id in available if device_id.startswith(wanted)] if wanted else []
        return kubelet_choice(request, on_wanted)
