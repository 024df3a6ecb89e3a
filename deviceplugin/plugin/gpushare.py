"""Allocate for `share` (`volcano.sh/gpu-memory`) and `number` (`volcano.sh/gpu-number`), SPEC §3.1.

The scheduler's choice is `volcano.sh/gpu-index`; pods are served in `volcano.sh/predicate-time`
order and marked `volcano.sh/gpu-assigned: "true"` once every GPU container is served.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass

import grpc

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.fit import keys, objects
from deviceplugin.fit.codec import format_gpu_index, parse_gpu_index
from deviceplugin.fit.errors import FitInputError
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.ledger import Allocation, GpuShare, Key, Patch
from deviceplugin.plugin.allocate import AllocateError, Placement, PodAllocator, as_written
from deviceplugin.plugin.pending import (
    ContainerNeed,
    Obj,
    PendingPod,
    annotation_time,
    container_needs,
    finished,
    need_keys,
    pod_identity,
    serving_rank,
    whole_units,
)


@dataclass(frozen=True, slots=True)
class GpusharePod(PendingPod):
    gpu_index: tuple[int, ...] | None = None  # None: the annotation is absent


def read_gpushare_pod(pod: Obj, resource: str) -> GpusharePod | None:
    """The pod as a candidate for `resource`; None when it is finished, terminating or assigned.

    Serving order: pods placed by the scheduler (with gpu-index) first, then predicate-time,
    creation time and UID.
    """
    notes = objects.annotations_of(pod)
    if finished(pod) or notes.get(keys.GPU_ASSIGNED) == "true":
        return None
    uid, namespace, name, created = pod_identity(pod)
    problems: list[str] = []
    needs = tuple(container_needs(pod, resource, problems))
    gpu_index: tuple[int, ...] | None = None
    if keys.GPU_INDEX in notes:
        try:
            gpu_index = tuple(parse_gpu_index(notes[keys.GPU_INDEX]))
        except FitInputError as err:
            problems.append(f"{keys.GPU_INDEX}: {err}")
    predicate_time = annotation_time(notes, keys.PREDICATE_TIME, "nanoseconds", problems)
    return GpusharePod(
        uid=uid,
        namespace=namespace,
        name=name,
        needs=needs,
        need_keys=need_keys(uid, needs, resource),
        rank=serving_rank(gpu_index is None, predicate_time, created, uid),
        problem="; ".join(problems),
        gpu_index=gpu_index,
    )


class GpushareAllocator(PodAllocator[GpusharePod]):
    """Serves one resource: `volcano.sh/gpu-memory` (share) or `volcano.sh/gpu-number` (number)."""

    lock_key = keys.GPUSHARE_LOCK

    @property
    def share(self) -> bool:
        return self.devices.resource.memory_based

    def _read_pod(self, pod: Obj) -> GpusharePod | None:
        return read_gpushare_pod(pod, self.resource)

    def _asking(self, units: int) -> str:
        return f"{units} unit(s) of {self.resource}" if self.share else f"{units} {self.resource}"

    def _slice(self, pod: GpusharePod, need: ContainerNeed) -> tuple[int, int]:
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

    def _gpu(self, where: str, index: int) -> GpuInfo:
        gpu = self._by_index.get(index)
        if gpu is None:
            raise AllocateError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "gpu-missing",
                f"{where}: {keys.GPU_INDEX} names GPU {index}, which node {self.node_name} does not have "
                f"(it has {', '.join(str(i) for i in sorted(self._by_index))})",
            )
        return self._usable(gpu, where, keys.GPU_INDEX)

    def _placement(self, pod: GpusharePod, need: ContainerNeed, kubelet_gpus: Sequence[GpuInfo]) -> Placement:
        where = f"pod {pod.display} container {need.name!r}"
        if pod.problem:
            raise AllocateError(grpc.StatusCode.INVALID_ARGUMENT, "bad-annotation", f"{where}: {pod.problem}")
        if pod.gpu_index is None:
            if self.share:
                raise AllocateError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "no-gpu-index",
                    f"{where}: no {keys.GPU_INDEX} annotation: in share mode the pod must be placed by a "
                    "Volcano-compatible scheduler (Volcano's deviceshare plugin or this project's extender)",
                )
            return Placement(pod, need, tuple(kubelet_gpus))  # number mode: the GPUs kubelet chose
        if self.share:
            if len(pod.gpu_index) != 1:
                raise AllocateError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "bad-annotation",
                    f"{where}: {keys.GPU_INDEX} {pod.gpu_index} lists {len(pod.gpu_index)} GPUs; "
                    "a gpu-memory pod lives on one",
                )
            gpu = self._gpu(where, pod.gpu_index[0])
            wanted = self.devices.layout.mib(need.units)
            if wanted > gpu.memory_mib:
                raise AllocateError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "too-large",
                    f"{where}: asks for {wanted} MiB; GPU {gpu.index} has {gpu.memory_mib} MiB",
                )
            return Placement(pod, need, (gpu,))
        start, stop = self._slice(pod, need)
        if stop > len(pod.gpu_index):
            raise AllocateError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "bad-annotation",
                f"{where}: needs GPUs {start}..{stop - 1} of {keys.GPU_INDEX} {list(pod.gpu_index)}, "
                f"which lists only {len(pod.gpu_index)}",
            )
        return Placement(pod, need, tuple(self._gpu(where, i) for i in pod.gpu_index[start:stop]))

    def _response(self, placement: Placement) -> pb.ContainerAllocateResponse:
        """volcano-sh/devices' envs, in both modes, for this container rather than the pod.

        `VOLCANO_GPU_ALLOCATED` is upstream's `devices x GPUMemoryFactor`: MiB in share mode; in
        number mode the GPU count at the default factor 1 (upstream multiplies there too).
        `VOLCANO_GPU_MEMORY_TOTAL` (and `VOLCANO_GPU_TOTAL`, its name before 2021) is the MiB of
        one card, as upstream: the container's first GPU (upstream: the node's GPU 0).
        """
        envs = {
            "NVIDIA_VISIBLE_DEVICES": self._visible(placement.gpus),
            "VOLCANO_GPU_ALLOCATED": str(self.devices.layout.mib(placement.need.units)),
        }
        envs["VOLCANO_GPU_TOTAL"] = envs["VOLCANO_GPU_MEMORY_TOTAL"] = str(placement.gpus[0].memory_mib)
        return pb.ContainerAllocateResponse(envs=envs)

    def _shares(self, placement: Placement) -> tuple[GpuShare, ...]:
        if self.share:
            gpu = placement.gpus[0]
            return (GpuShare(gpu.uuid, gpu.index, self.devices.layout.mib(placement.need.units)),)
        return tuple(GpuShare(gpu.uuid, gpu.index, gpu.memory_mib, 100) for gpu in placement.gpus)

    def _patches(self, placement: Placement, done: Container[Key]) -> list[Patch]:
        pod = placement.pod
        if pod.containers_left(done):
            return []
        # Volcano's node lock, if it took one
        return [Patch("pod", pod.namespace, pod.name, {keys.GPU_ASSIGNED: "true"}, pod.uid), self._unlock()]

    def _as_written(self, pod: Obj) -> Obj:
        notes = {k: v for k, v in objects.annotations_of(pod).items() if k != keys.GPU_ASSIGNED}
        return as_written(pod, notes)

    def _booking(self, pod: Obj, rows: Sequence[Allocation]) -> dict[str, str] | None:
        """`gpu-index` as the rows serve the pod (app containers' GPUs in order, then init
        containers'), with `gpu-assigned`, once every container asking for the resource is."""
        row_of = {row.container: row for row in rows if row.resource == self.resource}
        try:
            asking = [
                objects.container_name(container)
                for container in (*objects.containers(pod), *objects.init_containers(pod))
                if whole_units(container, self.resource)
            ]
        except FitInputError:
            return None
        if not asking or any(name not in row_of for name in asking):
            return None
        indices = dict.fromkeys(gpu.index for name in asking for gpu in row_of[name].gpus)
        return {keys.GPU_INDEX: format_gpu_index(indices), keys.GPU_ASSIGNED: "true"} if indices else None
