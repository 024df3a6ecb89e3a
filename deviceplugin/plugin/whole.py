"""Allocate for `whole` (`nvidia.com/gpu`, docs/whole.md): as NVIDIA's device plugin, a container
gets exactly the GPUs kubelet named, by UUID (or index) in `NVIDIA_VISIBLE_DEVICES`, with no
scheduler annotation needed, so a plain kube-scheduler places these pods.

What this node adds over NVIDIA's plugin: the pod is identified (as a `number` pod without
`gpu-index`) so the answer is recorded in the ledger and survives restarts; once every container
is served the pod is marked `volcano.sh/gpu-assigned` with `volcano.sh/gpu-index` = the GPUs it got,
so the extender books the exact cards (it books a pod bound without it by count until then); and
GetPreferredAllocation steers kubelet to the scheduler's cards when the extender chose them, else
to the best-connected set (`fit.topology.best_set`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Container, Sequence
from typing import Any

import grpc

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.fit import keys
from deviceplugin.fit.codec import format_gpu_index
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.ledger import Key, Patch
from deviceplugin.logs import get_log
from deviceplugin.plugin.allocate import AllocateError, Placement, kubelet_choice, linked_devices
from deviceplugin.plugin.gpushare import GpushareAllocator, GpusharePod
from deviceplugin.plugin.pending import ContainerNeed, PendingPod

log = get_log(__name__)


class WholeAllocator(GpushareAllocator):
    """Serves `nvidia.com/gpu` (`topology=`: how the node's GPUs connect, None when unknown)."""

    def _placement(self, pod: GpusharePod, need: ContainerNeed, kubelet_gpus: Sequence[GpuInfo]) -> Placement:
        if pod.problem:
            where = f"pod {pod.display} container {need.name!r}"
            raise AllocateError(grpc.StatusCode.INVALID_ARGUMENT, "bad-annotation", f"{where}: {pod.problem}")
        # in index order, as the extender's gpu-index: CUDA's device 0 is the lowest-indexed GPU
        return Placement(pod, need, tuple(sorted(kubelet_gpus, key=lambda gpu: gpu.index)))

    def _response(self, placement: Placement) -> pb.ContainerAllocateResponse:
        """`NVIDIA_VISIBLE_DEVICES` (NVIDIA's `envvar` device-list strategy) and volcano-sh/devices'
        number-mode envs: the GPU count and one card's MiB."""
        total = str(placement.gpus[0].memory_mib)
        envs = {
            "NVIDIA_VISIBLE_DEVICES": self._visible(placement.gpus),
            "VOLCANO_GPU_ALLOCATED": str(len(placement.gpus)),
            "VOLCANO_GPU_MEMORY_TOTAL": total,
            "VOLCANO_GPU_TOTAL": total,
        }
        return pb.ContainerAllocateResponse(envs=envs)

    def _scheduled(self, pod: GpusharePod, need: ContainerNeed) -> tuple[int, ...]:
        """The GPUs the extender chose for the container (its slice of `gpu-index`); () when none."""
        if pod.gpu_index is None or pod.problem:
            return ()
        start, stop = self._slice(pod, need)
        return pod.gpu_index[start:stop] if stop <= len(pod.gpu_index) else ()

    def _patches(self, placement: Placement, done: Container[Key]) -> list[Patch]:
        """Once every container is served: `gpu-assigned` and `gpu-index` as served (app
        containers' GPUs in order, then init containers'), what the extender books. No node lock
        to release: Volcano takes none for `nvidia.com/gpu`."""
        pod = placement.pod
        if pod.containers_left(done):
            return []
        indices: dict[int, None] = {}
        for need in sorted(pod.needs, key=lambda n: n.init):
            if need.name == placement.need.name:
                gpus: Sequence[Any] = placement.gpus
            else:
                row = self.ledger.get(pod.uid, need.name, self.resource)
                gpus = row.gpus if row is not None else ()
            indices.update(dict.fromkeys(gpu.index for gpu in gpus))
        notes = {keys.GPU_ASSIGNED: "true", keys.GPU_INDEX: format_gpu_index(indices)}
        return [Patch("pod", pod.namespace, pod.name, notes, pod.uid)]

    def _failure_patches(self, pod: PendingPod | None) -> list[Patch]:
        return []

    def _note_mismatch(self, placement: Placement, kubelet_gpus: Sequence[GpuInfo]) -> None:
        """Kubelet's choice is served (its accounting holds those devices); `gpu-index` is rewritten
        to it. Said, as for the other strategies, when it is not what the extender chose."""
        pod = placement.pod
        chosen = self._scheduled(pod, placement.need) if isinstance(pod, GpusharePod) else ()
        if not chosen or set(chosen) == {gpu.index for gpu in kubelet_gpus}:
            return
        self.stats.mismatches[self.resource] += 1
        kubelet_chose = sorted(gpu.index for gpu in kubelet_gpus)
        message = (
            f"kubelet assigned {self.resource} on GPU(s) {kubelet_chose} to container "
            f"{placement.need.name!r}, the scheduler chose {list(chosen)}; serving kubelet's choice"
        )
        log.warning("device ids do not match the scheduler's gpus", pod=placement.pod.display, detail=message)
        self.events.warning(self._involved(placement.pod), "GpuIdsMismatch", message)

    def preferred(self, request: pb.ContainerPreferredAllocationRequest) -> list[str]:
        """The scheduler's GPUs when the waiting pod names them, else the best-linked set of the
        available ones with the must-include ones (`linked_devices`), else the lowest indices: where
        the extender books a pod bound without it. Best effort: never an error."""
        wanted: tuple[int, ...] = ()
        found = self._candidate(request.allocation_size)
        if found:
            with contextlib.suppress(AllocateError):
                wanted = self._scheduled(found[0], found[1])
        if wanted:
            prefixes = self.devices.id_prefixes(wanted)
            return kubelet_choice(request, [d for d in request.available_deviceIDs if d in prefixes])
        linked = linked_devices(request, self.devices, self.topology)
        if linked:
            return kubelet_choice(request, linked)
        by_index = {self.devices.gpu_of(device_id): device_id for device_id in request.available_deviceIDs}
        return kubelet_choice(
            request, [by_index[gpu] for gpu in sorted(filter(None, by_index), key=lambda gpu: gpu.index)]
        )
