"""Allocate for `vgpu` (`volcano.sh/vgpu-number`), SPEC §3.2: HAMi-core sharing under Volcano.

The scheduler writes the devices of every vGPU container in `volcano.sh/devices-to-allocate`
(one `;`-separated slot per container asking for vGPU, in container order) with
`volcano.sh/vgpu-node`, `volcano.sh/vgpu-time` and `volcano.sh/bind-phase: allocating`. Each
`vgpu-number` Allocate serves the next unserved vGPU container of the earliest matching pod:
its UUIDs, HAMi-core's limits as env vars and mounts, its slot emptied in `devices-to-allocate`;
after the last one the pod gets `bind-phase: success` (or `failed`, with an Event, when it cannot
be served). `vgpu-memory` and `vgpu-cores` only let kubelet account capacity
(`allocate.AccountingAllocator`).

Unlike the upstream plugin, the container is matched by name (not by slot position among all
containers), a pod with two vGPU containers works, and a finished or terminating pod is never a
candidate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.fit import keys, objects
from deviceplugin.fit.codec import decode_pod_devices, encode_pod_devices
from deviceplugin.fit.errors import FitInputError
from deviceplugin.fit.model import Assigned
from deviceplugin.fit.vgpu import parse_vgpu_requests
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.health import HealthState
from deviceplugin.kube.events import EventRecorder
from deviceplugin.kube.podcache import PodCache
from deviceplugin.ledger import GpuShare, Key, Ledger, Patch
from deviceplugin.plugin import hook
from deviceplugin.plugin.allocate import AllocateError, PodAllocator, Served
from deviceplugin.plugin.devices import DeviceList
from deviceplugin.plugin.pending import ContainerNeed, Obj, PendingPod, pod_identity, whole_units

DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"
NODE_MODE = keys.MODE_HAMI_CORE  # the only sharing mode this plugin runs (MIG and MPS: not yet)
DONE_PHASES = (keys.BIND_PHASE_SUCCESS, keys.BIND_PHASE_FAILED)


@dataclass(frozen=True, slots=True)
class VgpuPod(PendingPod):
    slots: tuple[tuple[Assigned, ...], ...] = ()  # devices-to-allocate, decoded
    slot_of: Mapping[str, int] = field(default_factory=dict)  # container name -> its slot
    uncontrolled: frozenset[str] = frozenset()  # containers that set CUDA_DISABLE_CONTROL


def _sets_disable_control(container: Obj) -> bool:
    env = container.get("env") or []
    return isinstance(env, list) and any(
        isinstance(item, Mapping) and item.get("name") == DISABLE_CONTROL for item in env
    )


def _vgpu_containers(pod: Obj, problems: list[str]) -> list[str]:
    """Names of the containers the scheduler gave a slot: those asking for vGPU, in order."""
    try:
        return [request.name for request in parse_vgpu_requests(pod)]
    except FitInputError as err:
        problems.append(str(err))
        return []


def _slots(notes: Mapping[str, str], problems: list[str]) -> tuple[tuple[Assigned, ...], ...] | None:
    raw = notes.get(keys.DEVICES_TO_ALLOCATE)
    if raw is None:
        return None
    try:
        return tuple(tuple(devices) for devices in decode_pod_devices(raw))
    except FitInputError as err:
        problems.append(f"{keys.DEVICES_TO_ALLOCATE} {raw!r} cannot be decoded: {err}")
        return None


def read_vgpu_pod(pod: Obj, node_name: str) -> VgpuPod | None:
    """The pod as a candidate for `vgpu-number`; None once it is finished, terminating or its
    binding is settled (`bind-phase` success or failed).

    A pod that cannot be served as written stays a candidate with a `problem`, ranked after
    every servable pod, so its own Allocate fails with the reason instead of timing out.
    Otherwise: `vgpu-time`, creation time, UID.
    """
    notes = objects.annotations_of(pod)
    if (
        objects.is_terminal(pod)
        or objects.metadata(pod).get("deletionTimestamp")
        or notes.get(keys.BIND_PHASE) in DONE_PHASES
    ):
        return None
    uid, namespace, name, created = pod_identity(pod)
    resource = keys.VGPU_NUMBER
    problems: list[str] = []
    units: dict[str, tuple[bool, int]] = {}  # container -> (init container, vgpu-number)
    uncontrolled = set()
    for init, containers in ((True, objects.init_containers(pod)), (False, objects.containers(pod))):
        for container in containers:
            container_name = objects.container_name(container)
            try:
                count = whole_units(container, resource)
            except FitInputError as err:
                problems.append(str(err))
                continue
            if count and init:
                problems.append(f"init container {container_name!r}: vGPU is served to app containers only")
            if count:
                units[container_name] = (init, count)
            if _sets_disable_control(container):
                uncontrolled.add(container_name)
    if not units:
        return None
    node = notes.get(keys.VGPU_NODE)
    if node is None:
        problems.append(
            f"no {keys.VGPU_NODE} annotation: vGPU pods must be placed by a Volcano-compatible scheduler "
            "(Volcano's deviceshare plugin or this project's extender)"
        )
    elif node != node_name:
        problems.append(f"{keys.VGPU_NODE} is {node!r}, but the pod is bound to {node_name!r}")
    mode = notes.get(keys.VGPU_MODE, NODE_MODE)
    if mode != NODE_MODE:
        problems.append(f"{keys.VGPU_MODE} {mode!r}: node {node_name} runs {NODE_MODE} only")
    raw_time = notes.get(keys.VGPU_TIME)
    vgpu_time = int(raw_time) if raw_time is not None and raw_time.isascii() and raw_time.isdigit() else None
    if raw_time is not None and vgpu_time is None:
        problems.append(f"{keys.VGPU_TIME} {raw_time!r} is not a number of seconds")
    decoded = _slots(notes, problems)
    if decoded is None and node is not None and not problems:
        problems.append(f"no {keys.DEVICES_TO_ALLOCATE} annotation")
    slots = decoded or ()
    names = _vgpu_containers(pod, problems)
    slot_of: dict[str, int] = {}
    if decoded is not None and names:
        if len(slots) != len(names):
            problems.append(
                f"{keys.DEVICES_TO_ALLOCATE} has {len(slots)} container slot(s); "
                f"{len(names)} container(s) ask for vGPU ({', '.join(names)})"
            )
        else:
            slot_of = {container_name: position for position, container_name in enumerate(names)}
    needs = []
    for container_name, (init, count) in units.items():
        position = slot_of.get(container_name)
        if position is not None and not slots[position]:
            continue  # its slot was consumed already: served before the ledger knew
        if position is not None and len(slots[position]) != count:
            problems.append(
                f"container {container_name!r} asks for {count} {resource}; "
                f"{keys.DEVICES_TO_ALLOCATE} gives it {len(slots[position])} device(s)"
            )
        needs.append(ContainerNeed(container_name, init, count))
    return VgpuPod(
        uid=uid,
        namespace=namespace,
        name=name,
        needs=tuple(needs),
        need_keys=tuple((uid, need.name, resource) for need in needs),
        rank=(bool(problems), vgpu_time is None, vgpu_time or 0, created, uid),
        problem="; ".join(problems),
        slots=slots,
        slot_of=slot_of,
        uncontrolled=frozenset(uncontrolled),
    )


class VgpuAllocator(PodAllocator[VgpuPod]):
    """Serves `volcano.sh/vgpu-number`: the container's GPUs and its HAMi-core limits."""

    lock_key = keys.VGPU_LOCK

    def __init__(
        self,
        devices: DeviceList,
        health: HealthState,
        pods: PodCache,
        ledger: Ledger,
        events: EventRecorder,
        *,
        hook_path: hook.HookPath,
        **options: Any,
    ) -> None:
        super().__init__(devices, health, pods, ledger, events, **options)
        self.hook = hook_path
        self._by_uuid = {gpu.uuid: gpu for gpu in self.devices.gpus}

    def _read_pod(self, pod: Obj) -> VgpuPod | None:
        return read_vgpu_pod(pod, self.node_name)

    def _asking(self, units: int) -> str:
        return f"{units} vGPU(s) ({self.resource})"

    def _devices(self, pod: VgpuPod, need: ContainerNeed) -> tuple[Assigned, ...]:
        return pod.slots[pod.slot_of[need.name]]

    def _placement(self, pod: VgpuPod, need: ContainerNeed, kubelet_gpus: Sequence[GpuInfo]) -> Served:
        where = f"pod {pod.display} container {need.name!r}"
        if pod.problem:
            raise AllocateError(grpc.StatusCode.INVALID_ARGUMENT, "bad-annotation", f"{where}: {pod.problem}")
        gpus = []
        for device in self._devices(pod, need):
            gpu = self._by_uuid.get(device.uuid)
            if gpu is None:
                raise AllocateError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "gpu-missing",
                    f"{where}: {keys.DEVICES_TO_ALLOCATE} names GPU {device.uuid}, which node "
                    f"{self.node_name} does not have",
                )
            self._usable(gpu, where, keys.DEVICES_TO_ALLOCATE)
            memory = device.memory * self.devices.layout.factor
            if memory > gpu.memory_mib or device.cores > 100:
                raise AllocateError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "too-large",
                    f"{where}: asks for {memory} MiB and {device.cores}% of GPU {gpu.index}, "
                    f"which has {gpu.memory_mib} MiB and 100%",
                )
            gpus.append(gpu)
        return Served(pod, need, tuple(gpus))

    def _response(self, served: Served) -> pb.ContainerAllocateResponse:
        """The container's env and mounts; its cache directory is created on the host here."""
        pod, need = served.pod, served.need
        assert isinstance(pod, VgpuPod)
        where = f"pod {pod.display} container {need.name!r}"
        if not self.hook.library.is_file():
            raise AllocateError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "hook-missing",
                f"{where}: the HAMi-core library {self.hook.library} is missing on node {self.node_name} "
                "(install it under --hook-path)",
                pod,
            )
        devices = self._devices(pod, need)
        envs = {"NVIDIA_VISIBLE_DEVICES": self._visible(served.gpus)}
        for i, device in enumerate(devices):
            envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{device.memory * self.devices.layout.factor}m"
        envs["CUDA_DEVICE_SM_LIMIT"] = str(devices[0].cores)
        envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{hook.CONTAINER_CACHE_DIR}/{pod.uid}.cache"
        cache = self.hook.container_dir(pod.uid, need.name)
        mounts = [
            pb.Mount(container_path=hook.CONTAINER_LIBRARY, host_path=str(self.hook.library), read_only=True),
            pb.Mount(container_path=hook.CONTAINER_CACHE_DIR, host_path=str(cache), read_only=False),
            pb.Mount(container_path=hook.CONTAINER_LOCK_DIR, host_path=str(self.hook.lock), read_only=False),
        ]
        if need.name not in pod.uncontrolled:
            preload = str(self.hook.preload)
            mounts.append(pb.Mount(container_path=hook.CONTAINER_PRELOAD, host_path=preload, read_only=True))
        return pb.ContainerAllocateResponse(envs=envs, mounts=mounts)

    def _shares(self, served: Served) -> tuple[GpuShare, ...]:
        assert isinstance(served.pod, VgpuPod)
        devices = self._devices(served.pod, served.need)
        factor = self.devices.layout.factor
        return tuple(
            GpuShare(gpu.uuid, gpu.index, device.memory * factor, device.cores)
            for gpu, device in zip(served.gpus, devices, strict=True)
        )

    def _patches(self, served: Served, done: frozenset[Key]) -> list[Patch]:
        pod = served.pod
        assert isinstance(pod, VgpuPod)
        # Every served slot emptied, not only this one: the cache may not yet show the previous
        # container's patch, and the last patch sent must not bring its slot back.
        slots = [
            () if (pod.uid, container, self.resource) in done else pod.slots[position]
            for container, position in sorted(pod.slot_of.items(), key=lambda item: item[1])
        ]
        annotations = {keys.DEVICES_TO_ALLOCATE: encode_pod_devices(slots)}
        if pod.containers_left(done):
            return [Patch("pod", pod.namespace, pod.name, annotations)]
        annotations[keys.BIND_PHASE] = keys.BIND_PHASE_SUCCESS
        return [Patch("pod", pod.namespace, pod.name, annotations), self._unlock()]

    def _failure_patches(self, pod: PendingPod | None) -> list[Patch]:
        if pod is None:
            return [self._unlock()]
        failed = Patch("pod", pod.namespace, pod.name, {keys.BIND_PHASE: keys.BIND_PHASE_FAILED})
        return [failed, self._unlock()]
