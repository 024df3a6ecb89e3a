"""Allocate and GetPreferredAllocation for `share` and `number` (SPEC §3.1, §3.3).

The pod is resolved from the node's pod cache (see `pending`), its GPUs come from the scheduler's
`volcano.sh/gpu-index`, and the answer is recorded in the ledger before it is sent, with the pod
and node annotation patches it calls for queued in the ledger's outbox: no API request is made
while serving. Every failure is a gRPC error naming the pod, the container and the problem, plus
a Kubernetes Event.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.fit import keys
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.health import HealthState
from deviceplugin.kube.events import EventRecorder, Involved
from deviceplugin.kube.podcache import PodCache
from deviceplugin.ledger import Allocation, GpuShare, Ledger, Patch
from deviceplugin.logs import get_log
from deviceplugin.plugin.devices import DeviceList
from deviceplugin.plugin.pending import ContainerNeed, PendingPod, PendingPods

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


@dataclass
class AllocationStats:
    """Counters the metrics endpoint exports: outcomes per resource, failures per reason, and
    how often kubelet's device IDs were not on the GPUs the scheduler chose."""

    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    mismatches: Counter[str] = field(default_factory=Counter)


class Allocator(Protocol):
    """What the DevicePlugin service needs to answer Allocate and GetPreferredAllocation."""

    def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse: ...

    def preferred(self, request: pb.ContainerPreferredAllocationRequest) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class Served:
    pod: PendingPod
    need: ContainerNeed
    gpus: tuple[GpuInfo, ...]


class GpushareAllocator:
    """Serves one resource: `volcano.sh/gpu-memory` (share) or `volcano.sh/gpu-number` (number)."""

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
        self.share = devices.resource.memory_based
        self.health = health
        self.pods = pods
        self.ledger = ledger
        self.events = events
        self.node_name = node_name
        self.id_strategy = id_strategy
        self.timeout_s = timeout_s
        self.stats = stats or AllocationStats()
        self.on_outbox = on_outbox  # patches were queued: the outbox worker can send them now
        self.pending = PendingPods(self.resource)
        self.pending.follow(pods)
        self._by_index = {gpu.index: gpu for gpu in devices.gpus}
        self._lock = threading.Lock()  # one resolution at a time: no pod is served twice

    # --- resolution ---------------------------------------------------------------------------

    def _resolve(self, units: int, deadline: float) -> tuple[PendingPod, ContainerNeed]:
        """The pod and container this request is for, waiting (bounded) for the cache."""
        served = self.ledger.served()
        match = self.pending.first(served, units)
        if match is None:
            self.pods.wait_until(
                lambda _: self.pending.first(served, units) is not None, max(0.0, deadline - time.monotonic())
            )
            match = self.pending.first(served, units)
        if match is not None:
            return match
        what = f"{units} unit(s) of {self.resource}" if self.share else f"{units} {self.resource}"
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

    def _slice(self, pod: PendingPod, need: ContainerNeed) -> tuple[int, int]:
        """Which entries of gpu-index belong to a number-mode container: app containers take
        consecutive GPUs in container order; init containers run first and start from the top."""
        if need.init:
            return 0, need.units
        offset = 0
        for other in pod.needs:
            if other.name == need.name:
                break
            if not other.init:
                offset += other.units
        return offset, offset + need.units

    def _gpu(self, pod: PendingPod, need: ContainerNeed, index: int) -> GpuInfo:
        where = f"pod {pod.display} container {need.name!r}"
        gpu = self._by_index.get(index)
        if gpu is None:
            raise AllocateError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "gpu-missing",
                f"{where}: {keys.GPU_INDEX} names GPU {index}, which node {self.node_name} does not have "
                f"(it has {', '.join(str(i) for i in sorted(self._by_index))})",
                pod,
            )
        if not self.health.snapshot()[1].get(gpu.uuid, False):
            raise AllocateError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "gpu-unhealthy",
                f"{where}: {keys.GPU_INDEX} names GPU {index} ({gpu.uuid}), which is unhealthy",
                pod,
            )
        return gpu

    def _placement(self, pod: PendingPod, need: ContainerNeed, kubelet_gpus: Sequence[GpuInfo]) -> Served:
        where = f"pod {pod.display} container {need.name!r}"
        if pod.problem:
            raise AllocateError(
                grpc.StatusCode.INVALID_ARGUMENT, "bad-annotation", f"{where}: {pod.problem}", pod
            )
        if pod.gpu_index is None:
            if self.share:
                raise AllocateError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "no-gpu-index",
                    f"{where}: no {keys.GPU_INDEX} annotation: in share mode the pod must be placed by a "
                    "Volcano-compatible scheduler (Volcano's deviceshare plugin or this project's extender)",
                    pod,
                )
            return Served(pod, need, tuple(kubelet_gpus))  # number mode: the GPUs kubelet chose
        if self.share:
            if len(pod.gpu_index) != 1:
                raise AllocateError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "bad-annotation",
                    f"{where}: {keys.GPU_INDEX} {pod.gpu_index} lists {len(pod.gpu_index)} GPUs; "
                    "a gpu-memory pod lives on one",
                    pod,
                )
            gpu = self._gpu(pod, need, pod.gpu_index[0])
            wanted = need.units * self.devices.layout.factor
            if wanted > gpu.memory_mib:
                raise AllocateError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "too-large",
                    f"{where}: asks for {wanted} MiB; GPU {gpu.index} has {gpu.memory_mib} MiB",
                    pod,
                )
            return Served(pod, need, (gpu,))
        start, stop = self._slice(pod, need)
        if stop > len(pod.gpu_index):
            raise AllocateError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "bad-annotation",
                f"{where}: needs GPUs {start}..{stop - 1} of {keys.GPU_INDEX} {list(pod.gpu_index)}, "
                f"which lists only {len(pod.gpu_index)}",
                pod,
            )
        return Served(pod, need, tuple(self._gpu(pod, need, i) for i in pod.gpu_index[start:stop]))

    # --- the answer ---------------------------------------------------------------------------

    def _visible(self, gpus: Sequence[GpuInfo]) -> str:
        return ",".join(gpu.uuid if self.id_strategy == "uuid" else str(gpu.index) for gpu in gpus)

    def _response(self, served: Served) -> pb.ContainerAllocateResponse:
        envs = {"NVIDIA_VISIBLE_DEVICES": self._visible(served.gpus)}
        if self.share:
            (gpu,) = served.gpus
            envs["VOLCANO_GPU_ALLOCATED"] = str(served.need.units * self.devices.layout.factor)
            envs["VOLCANO_GPU_TOTAL"] = envs["VOLCANO_GPU_MEMORY_TOTAL"] = str(gpu.memory_mib)
        return pb.ContainerAllocateResponse(envs=envs)

    def _shares(self, served: Served) -> tuple[GpuShare, ...]:
        if self.share:
            return (
                GpuShare(
                    served.gpus[0].uuid, served.gpus[0].index, served.need.units * self.devices.layout.factor
                ),
            )
        return tuple(GpuShare(gpu.uuid, gpu.index, gpu.memory_mib, 100) for gpu in served.gpus)

    def _patches(self, pod: PendingPod, complete: bool) -> list[Patch]:
        if not complete:
            return []
        return [
            Patch("pod", pod.namespace, pod.name, {keys.GPU_ASSIGNED: "true"}),
            Patch("node", "", self.node_name, {keys.GPUSHARE_LOCK: None}),  # Volcano's node lock, if taken
        ]

    def _check_ids(self, device_ids: Sequence[str]) -> list[GpuInfo]:
        if not device_ids:
            raise AllocateError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "empty-request",
                f"{self.resource}: Allocate named no device IDs",
            )
        gpus = [self.devices.gpu_of(device_id) for device_id in device_ids]
        unknown = [d for d, gpu in zip(device_ids, gpus, strict=True) if gpu is None]
        if unknown:
            raise AllocateError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "unknown-devices",
                f"{self.resource}: device IDs {', '.join(unknown[:5])} are not devices of this node",
            )
        return [gpu for gpu in gpus if gpu is not None]

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

    # --- RPCs ---------------------------------------------------------------------------------

    def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        """Serve one container; raises `AllocateError` (after an Event) when it cannot."""
        try:
            response, outcome = self._allocate(device_ids, time.monotonic() + self.timeout_s)
        except AllocateError as err:
            self._failed(err)
            raise
        self.stats.outcomes[(self.resource, outcome)] += 1
        return response

    def _allocate(
        self, device_ids: Sequence[str], deadline: float
    ) -> tuple[pb.ContainerAllocateResponse, str]:
        kubelet_gpus = self._check_ids(device_ids)
        with self._lock:
            repeat = self.ledger.find_by_devices(self.resource, device_ids)
            if repeat is not None:
                return pb.ContainerAllocateResponse.FromString(repeat.response), "repeat"
            pod, need = self._resolve(len(device_ids), deadline)
            served = self._placement(pod, need, kubelet_gpus)
            response = self._response(served)
            complete = self.pending.containers_left(pod, self.ledger.served()) == 1
            self.ledger.record(
                Allocation(
                    pod_uid=pod.uid,
                    namespace=pod.namespace,
                    pod_name=pod.name,
                    container=need.name,
                    resource=self.resource,
                    gpus=self._shares(served),
                    device_ids=tuple(device_ids),
                    response=response.SerializeToString(),
                ),
                self._patches(pod, complete),
            )
        if complete:
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
        return response, "served"

    def _failed(self, err: AllocateError) -> None:
        self.stats.outcomes[(self.resource, "failed")] += 1
        self.stats.failures[err.reason] += 1
        log.error("allocate failed", resource=self.resource, reason=err.reason, error=str(err))
        about = self._involved(err.pod) if err.pod else Involved.node(self.node_name, uid=self.node_name)
        self.events.warning(about, "GpuAllocationFailed", str(err))
        self.ledger.enqueue([Patch("node", "", self.node_name, {keys.GPUSHARE_LOCK: None})])
        self.on_outbox()

    def preferred(self, request: pb.ContainerPreferredAllocationRequest) -> list[str]:
        """Device IDs on the GPU(s) the scheduler chose, so kubelet's own records name them.
        Best effort: never an error (kubelet falls back to its own choice on a short answer)."""
        size = request.allocation_size
        available = request.available_deviceIDs  # 160,000 IDs and more in share mode
        chosen = dict.fromkeys(request.must_include_deviceIDs)  # an ordered set
        wanted: tuple[str, ...] = ()
        with self._lock:
            found = self.pending.first(self.ledger.served(), size)
        if found:
            pod, need = found
            with contextlib.suppress(AllocateError):  # Allocate will report it
                wanted = self.devices.id_prefixes(gpu.index for gpu in self._placement(pod, need, ()).gpus)
        on_wanted = [device_id for device_id in available if device_id.startswith(wanted)] if wanted else []
        for device_id in itertools.chain(on_wanted, available):  # the scheduler's GPUs first
            if len(chosen) >= size:
                break
            chosen.setdefault(device_id)
        return list(chosen)
