"""Allocate for `vgpu` (`volcano.sh/vgpu-number` and `volcano.sh/vgpu-memory`), SPEC §3.2:
HAMi-core sharing under Volcano.

The scheduler writes the devices of every vGPU container in `volcano.sh/devices-to-allocate`
(one `;`-separated slot per container, in container order, by Volcano's rule: see
`fit.vgpu_slots`) with `volcano.sh/vgpu-node`, `volcano.sh/vgpu-time` and
`volcano.sh/bind-phase: allocating`. A slot is served by the Allocate kubelet calls for its
container: `vgpu-number` when the container limits it, else `vgpu-memory` (a container that asks
memory alone gets one device, and kubelet never calls the number plugin for it). Serving means
the container's UUIDs, HAMi-core's limits as env vars and mounts, its slot emptied in
`devices-to-allocate`; after the last slot the pod gets `bind-phase: success` (or `failed`, with
an Event, when it cannot be served). The `vgpu-memory` Allocate of a container that also limits
`vgpu-number` only accounts capacity: an empty response, recorded so the pod's next container is
matched. `vgpu-cores` always only accounts (`allocate.AccountingAllocator`).

On a `mig` node (docs/mig.md) each device of a slot is a MIG slot `GPU-<uuid>[<group>-<pos>]`:
the container gets that slot's MIG device (`plugin.vgpumig`, the card partitioned into the group
first when it holds no pod) as `NVIDIA_VISIBLE_DEVICES=MIG-<uuid>`, and nothing of HAMi-core.
On an `mps` node (docs/mps.md) a slot is one whole GPU, shared through its MPS control daemon
(`plugin.vgpumps`): the MPS client's env and mounts, and again nothing of HAMi-core.

Unlike the upstream plugin, the container is matched by name (not by slot position among all
containers), a pod with two vGPU containers works, a memory-only container gets its GPU, and a
finished or terminating pod is never a candidate.
"""

from __future__ import annotations

import os
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.fit import keys, objects
from deviceplugin.fit.bounds import shown
from deviceplugin.fit.codec import decode_mig_id, decode_pod_devices, encode_pod_devices, physical_uuid
from deviceplugin.fit.errors import FitInputError, PodDevicesError
from deviceplugin.fit.model import Assigned
from deviceplugin.fit.vgpu_slots import SlotOwner, vgpu_slot_owners
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.health import HealthState
from deviceplugin.gpu.mps import MpsDaemons, MpsError
from deviceplugin.kube.events import EventRecorder
from deviceplugin.kube.podcache import PodCache
from deviceplugin.ledger import Allocation, GpuShare, Key, Ledger, Patch
from deviceplugin.plugin import hook, vgpumps
from deviceplugin.plugin.allocate import AllocateError, Placement, PodAllocator, as_written
from deviceplugin.plugin.devices import DeviceList
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
)
from deviceplugin.plugin.podfields import disables_control
from deviceplugin.plugin.vgpumig import MigCards, MigRefusal

OVERSUBSCRIBE = "CUDA_OVERSUBSCRIBE"  # HAMi-core backs memory beyond the card with host memory
CORE_POLICY = "GPU_CORE_UTILIZATION_POLICY"  # "disable": HAMi-core does not throttle to SM_LIMIT


@dataclass(frozen=True, slots=True)
class VgpuPod(PendingPod):
    slots: tuple[tuple[Assigned, ...], ...] = ()  # devices-to-allocate, decoded
    slot_of: Mapping[str, int] = field(default_factory=dict)  # container name -> its slot
    slot_keys: tuple[Key, ...] = ()  # per slot: the ledger key of the Allocate that serves it
    accounting: frozenset[str] = frozenset()  # containers this resource only accounts for
    settled: bool = False  # bind-phase success: only accounting needs are left
    uncontrolled: frozenset[str] = frozenset()  # containers that set CUDA_DISABLE_CONTROL

    def next_need(self, served: Container[Key]) -> ContainerNeed | None:
        """After `bind-phase: success` an accounting need is matched only when this node served
        the container's slot: a pod settled by another plugin (or before a lost ledger) must not
        answer a later pod's `vgpu-memory` request with an empty response."""
        for need, key in zip(self.needs, self.need_keys, strict=True):
            if key in served:
                continue
            if not self.settled or (self.uid, need.name, keys.VGPU_NUMBER) in served:
                return need
        return None


# --- parse: annotations and containers to typed values, with why a present value is unreadable ---


@dataclass(frozen=True, slots=True)
class _Notes:
    """The scheduler's vGPU annotations; a value that cannot be read is None, its reason in
    `errors` (vgpu-time's first, then devices-to-allocate's)."""

    node: str | None
    mode: str
    vgpu_time: int | None
    slots: tuple[tuple[Assigned, ...], ...] | None  # devices-to-allocate, decoded
    errors: tuple[str, ...]


def _slots(notes: Mapping[str, str], errors: list[str]) -> tuple[tuple[Assigned, ...], ...] | None:
    raw = notes.get(keys.DEVICES_TO_ALLOCATE)
    if raw is None:
        return None
    if not raw:
        return ((),)  # one consumed slot: `;`-joining a single empty container gives ""
    try:
        return tuple(tuple(devices) for devices in decode_pod_devices(raw))
    except FitInputError as err:
        errors.append(f"{keys.DEVICES_TO_ALLOCATE} {shown(raw)} cannot be decoded: {err}")
        return None


def _mig_slot_problem(device: Assigned, mode: str) -> str | None:
    """A device of the wrong kind for the node's mode: a MIG slot on a hami-core node, a whole
    card (or an unreadable slot) on a mig node."""
    if mode != keys.MODE_MIG:
        if "[" in device.uuid:
            return f"{keys.DEVICES_TO_ALLOCATE} names MIG slot {shown(device.uuid)}; the node runs {mode}"
        return None
    try:
        decode_mig_id(device.uuid)
    except PodDevicesError as err:
        return f"{keys.DEVICES_TO_ALLOCATE}: the node runs mig: {err}"
    return None


def _read_notes(notes: Mapping[str, str], mode: str) -> _Notes:
    errors: list[str] = []
    vgpu_time = annotation_time(notes, keys.VGPU_TIME, "seconds", errors)
    slots = _slots(notes, errors)
    if slots is not None:
        wrong = (_mig_slot_problem(device, mode) for slot in slots for device in slot)
        errors.extend(dict.fromkeys(problem for problem in wrong if problem is not None))
    return _Notes(notes.get(keys.VGPU_NODE), notes.get(keys.VGPU_MODE, mode), vgpu_time, slots, tuple(errors))


@dataclass(frozen=True, slots=True)
class _Containers:
    """The containers kubelet calls the resource's Allocate for, in kubelet order; which of them
    it only accounts for (their slot is another resource's); which set CUDA_DISABLE_CONTROL; and
    what is wrong with them (an unreadable limit, a vGPU init container), in container order."""

    needs: tuple[ContainerNeed, ...]
    accounting: frozenset[str]
    uncontrolled: frozenset[str]
    problems: tuple[str, ...]


def _read_containers(pod: Obj, resource: str, serves: Mapping[str, str]) -> _Containers:
    uncontrolled = frozenset(
        objects.container_name(container)
        for container in (*objects.init_containers(pod), *objects.containers(pod))
        if disables_control(container.get("env"))
    )
    needs: list[ContainerNeed] = []
    accounting: set[str] = set()
    problems: list[str] = []
    for need in container_needs(pod, resource, problems):
        if need.init:
            # Kept strict: Volcano books nothing for init containers and writes them no slot,
            # so there are no limits to give; serving one would run an unbooked process
            # on a shared GPU (the upstream plugin hands it the first app container's slot).
            problems.append(f"init container {need.name!r}: vGPU is served to app containers only")
        elif serves.get(need.name) != resource:
            accounting.add(need.name)
        needs.append(need)
    return _Containers(tuple(needs), frozenset(accounting), uncontrolled, tuple(problems))


# --- validate: what protects the containers (the requests were Volcano's to judge) -------------


def _placement_problems(notes: _Notes, node_name: str, mode: str) -> list[str]:
    """Whether the pod was placed on this node, in the mode it runs."""
    problems = []
    if notes.node is None:
        problems.append(
            f"no {keys.VGPU_NODE} annotation: vGPU pods must be placed by a Volcano-compatible scheduler "
            "(Volcano's deviceshare plugin or this project's extender)"
        )
    elif notes.node != node_name:
        problems.append(f"{keys.VGPU_NODE} is {notes.node!r}, but the pod is bound to {node_name!r}")
    if notes.mode != mode:
        problems.append(f"{keys.VGPU_MODE} {notes.mode!r}: node {node_name} runs {mode} only")
    return problems


def _slot_of(
    slots: tuple[tuple[Assigned, ...], ...], owners: Sequence[SlotOwner], problems: list[str]
) -> dict[str, int]:
    """Each slot-owning container's slot; none (and the reason in `problems`) when the slot
    count is not Volcano's for this spec: any mapping would be a guess that could give a
    container another container's GPUs and limits."""
    if len(slots) == len(owners):
        return {owner.name: position for position, owner in enumerate(owners)}
    problems.append(
        f"{keys.DEVICES_TO_ALLOCATE} has {len(slots)} container slot(s); {len(owners)} container(s) "
        f"limit {keys.VGPU_NUMBER} or {keys.VGPU_MEMORY} ({', '.join(o.name for o in owners)})"
    )
    return {}


def _slot_size_problem(need: ContainerNeed, slot: Sequence[Assigned], resource: str) -> str | None:
    """Kept strict: kubelet hands the container this many devices; a slot of another size was
    not written for it."""
    by_count = resource == keys.VGPU_NUMBER
    if len(slot) == (need.units if by_count else 1):
        return None
    asks = f"{need.units} {resource}" if by_count else f"{resource} alone (one device)"
    return (
        f"container {need.name!r} asks for {asks}; {keys.DEVICES_TO_ALLOCATE} gives it {len(slot)} device(s)"
    )


# --- the reader ---------------------------------------------------------------------------------


def read_vgpu_pod(
    pod: Obj, node_name: str, resource: str = keys.VGPU_NUMBER, mode: str = keys.MODE_HAMI_CORE
) -> VgpuPod | None:
    """The pod as a candidate for `resource` (`vgpu-number` or `vgpu-memory`) on a node running
    `mode`; None once it is finished, terminating or failed, or (`bind-phase: success`) has no
    accounting need left.

    A pod that cannot be served as written stays a candidate with a `problem`, ranked after
    every servable pod, so its own Allocate fails with the reason instead of timing out.
    Otherwise: `vgpu-time`, creation time, UID. Only what protects the containers is checked:
    the requests themselves were Volcano's to judge, and the slot says what each one gets.
    """
    annotations = objects.annotations_of(pod)
    phase = annotations.get(keys.BIND_PHASE)
    if finished(pod) or phase == keys.BIND_PHASE_FAILED:
        return None
    uid, namespace, name, created = pod_identity(pod)
    settled = phase == keys.BIND_PHASE_SUCCESS
    owners = vgpu_slot_owners(pod)
    serves = {owner.name: keys.VGPU_NUMBER if owner.by_count else keys.VGPU_MEMORY for owner in owners}
    containers = _read_containers(pod, resource, serves)
    needs = containers.needs
    if settled:  # every slot is served; a late vgpu-memory call of a number container may remain
        needs = tuple(need for need in needs if need.name in containers.accounting)
    if not needs:
        return None
    notes = _read_notes(annotations, mode)

    problems = [*containers.problems, *_placement_problems(notes, node_name, mode), *notes.errors]
    if notes.slots is None and notes.node is not None and not problems:
        problems.append(f"no {keys.DEVICES_TO_ALLOCATE} annotation")
    slots = notes.slots or ()
    slot_of = _slot_of(slots, owners, problems) if notes.slots is not None and owners else {}
    kept = []
    for need in needs:
        position = slot_of.get(need.name)
        if need.name in containers.accounting or position is None:
            kept.append(need)
        elif slots[position]:  # an empty slot was consumed already: served before the ledger knew
            problem = _slot_size_problem(need, slots[position], resource)
            if problem is not None:
                problems.append(problem)
            kept.append(need)

    return VgpuPod(
        uid=uid,
        namespace=namespace,
        name=name,
        needs=tuple(kept),
        need_keys=need_keys(uid, kept, resource),
        rank=serving_rank(bool(problems), notes.vgpu_time, created, uid),
        problem="; ".join(problems),
        slots=slots,
        slot_of=slot_of,
        slot_keys=tuple((uid, owner.name, serves[owner.name]) for owner in owners) if slot_of else (),
        accounting=containers.accounting,
        settled=settled,
        uncontrolled=containers.uncontrolled,
    )


@dataclass(frozen=True, slots=True)
class _Made:
    """What a container gets, worked out as its pod came, for one reading of the pod: its GPUs
    (each the node's and offering what the slot asks; their health is checked per Allocate),
    what it holds of them and its response."""

    pod: VgpuPod
    gpus: tuple[GpuInfo, ...]
    shares: tuple[GpuShare, ...]
    response: pb.ContainerAllocateResponse


class VgpuAllocator(PodAllocator[VgpuPod]):
    """Serves `volcano.sh/vgpu-number` or `volcano.sh/vgpu-memory`: the GPUs and HAMi-core limits
    of each container whose slot the resource serves, an empty answer for the others.

    Kubelet admits one pod at a time and calls the plugins one after another, so the two
    allocators of a node (each with its own lock) never record for the same pod at once.
    """

    lock_key = keys.VGPU_LOCK
    pod_specific = True  # HAMi-core's cache directory and file are the pod's

    def __init__(
        self,
        devices: DeviceList,
        health: HealthState,
        pods: PodCache,
        ledger: Ledger,
        events: EventRecorder,
        *,
        hook_path: hook.HookPath,
        disable_core_limit: bool = False,
        mig: MigCards | None = None,
        mps: MpsDaemons | None = None,
        **options: Any,
    ) -> None:
        self.mig = mig  # a mig node's cards
        self.mps = mps  # an mps node's control daemons; neither: hami-core
        self.mode = keys.MODE_HAMI_CORE
        if mig is not None or mps is not None:
            self.mode = keys.MODE_MIG if mig is not None else keys.MODE_MPS
        super().__init__(devices, health, pods, ledger, events, **options)
        self.hook = hook_path
        self._by_uuid = {gpu.uuid: gpu for gpu in self.devices.gpus}
        self._rebuilding = False  # `rebuilt` runs: the cards are read, never partitioned
        if self.mode == keys.MODE_HAMI_CORE:  # a MIG device may not exist before its Allocate, and an
            # MPS answer sets the daemon's limits: nothing is made ahead
            pods.add_listener(self._on_pod)  # after `pending`'s: it reads the pod as a candidate
        # What every container's response shares, built once (the request path builds only
        # what names the pod; the library is still looked for on every call).
        self._library = str(hook_path.library)
        self._library_mount = pb.Mount(
            container_path=hook.CONTAINER_LIBRARY, host_path=self._library, read_only=True
        )
        self._lock_mount = pb.Mount(
            container_path=hook.CONTAINER_LOCK_DIR, host_path=str(hook_path.lock), read_only=False
        )
        self._preload_mount = pb.Mount(
            container_path=hook.CONTAINER_PRELOAD, host_path=str(hook_path.preload), read_only=True
        )
        self._node_envs: dict[str, str] = {}  # after the container's own, in this order
        if self.devices.layout.memory_scaling > 1:  # as HAMi: the upstream Volcano plugin keys it to cores
            self._node_envs[OVERSUBSCRIBE] = "true"
        if disable_core_limit:
            self._node_envs[CORE_POLICY] = "disable"
        self._made: dict[tuple[str, str], _Made] = {}  # (pod UID, container): see `_on_pod`
        if mps is not None:
            vgpumps.restore(mps, self.ledger.active())

    def _read_pod(self, pod: Obj) -> VgpuPod | None:
        return read_vgpu_pod(pod, self.node_name, self.resource, self.mode)

    def _on_pod(self, kind: str, pod: Obj) -> None:
        """Pods come ahead of their Allocates: what the containers this resource serves get is
        made then, on the pod cache's thread: their cache directories (`hook.make_ahead`), and
        their GPUs, shares and responses (`_Made`) for the candidate `pending` just read. These
        go when the pod is no candidate any more (served, gone); a directory no Allocate took
        goes with the pod. The hook's ready directories are topped up."""
        uid = objects.uid(pod)
        gone = kind == "DELETED" or finished(pod)
        candidate = None if gone else self.pending.candidate(uid)
        if candidate is None or candidate.problem:
            for key in [key for key in list(self._made) if key[0] == uid]:  # a copy: Allocates read it
                self._made.pop(key, None)
            if gone:
                self.hook.drop_ahead(uid)
        else:
            for need in candidate.needs:
                if need.name not in candidate.accounting:
                    self.hook.make_ahead(uid, need.name)
                    self._make(candidate, need)
        self.hook.refill()

    def _make(self, pod: VgpuPod, need: ContainerNeed) -> None:
        try:
            gpus = self._gpus(pod, need, healthy=False)
        except AllocateError:  # the Allocate refuses it (`_placement`)
            self._made.pop((pod.uid, need.name), None)
            return
        shares = self._shares_of(pod, need, gpus)
        self._made[(pod.uid, need.name)] = _Made(pod, gpus, shares, self._build(pod, need, gpus))

    def _made_for(self, pod: VgpuPod, need: ContainerNeed) -> _Made | None:
        """What was made for the container as `pod` came, if for this very reading of it."""
        made = self._made.get((pod.uid, need.name))
        return made if made is not None and made.pod is pod else None

    def _asking(self, units: int) -> str:
        if self.resource == keys.VGPU_NUMBER:
            return f"{units} vGPU(s) ({self.resource})"
        return f"{units} unit(s) of {self.resource}"

    def _devices(self, pod: VgpuPod, need: ContainerNeed) -> tuple[Assigned, ...]:
        return pod.slots[pod.slot_of[need.name]]

    def _placement(self, pod: VgpuPod, need: ContainerNeed, kubelet_gpus: Sequence[GpuInfo]) -> Placement:
        where = f"pod {pod.display} container {need.name!r}"
        if pod.problem:
            raise AllocateError(grpc.StatusCode.INVALID_ARGUMENT, "bad-annotation", f"{where}: {pod.problem}")
        if need.name in pod.accounting:
            return Placement(pod, need, tuple(kubelet_gpus))  # kubelet's accounting: nothing to place
        made = self._made_for(pod, need)
        if made is None:
            return Placement(pod, need, self._gpus(pod, need, healthy=True))
        for gpu in made.gpus:  # the rest was checked as the pod came
            self._usable(gpu, f"pod {pod.display} container {need.name!r}", keys.DEVICES_TO_ALLOCATE)
        return Placement(pod, need, made.gpus)

    def _gpus(self, pod: VgpuPod, need: ContainerNeed, *, healthy: bool) -> tuple[GpuInfo, ...]:
        """The GPUs of the container's slot, each checked in turn: the node's, healthy (when
        `healthy`), offering what the slot asks."""
        where = f"pod {pod.display} container {need.name!r}"
        gpus = []
        for device in self._devices(pod, need):
            gpu = self._by_uuid.get(physical_uuid(device.uuid))
            if gpu is None:
                raise AllocateError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "gpu-missing",
                    f"{where}: {keys.DEVICES_TO_ALLOCATE} names GPU {physical_uuid(device.uuid)}, which node "
                    f"{self.node_name} does not have",
                )
            if healthy:
                self._usable(gpu, where, keys.DEVICES_TO_ALLOCATE)
            memory = self.devices.layout.mib(device.memory)
            offered = self.devices.layout.vgpu_memory_mib(gpu)  # above the card's when oversubscribed
            if memory > offered or device.cores > 100:
                raise AllocateError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "too-large",
                    f"{where}: asks for {memory} MiB and {device.cores}% of GPU {gpu.index}, "
                    f"which offers {offered} MiB and 100%",
                )
            gpus.append(gpu)
        return tuple(gpus)

    def _response(self, placement: Placement) -> pb.ContainerAllocateResponse:
        """The container's env and mounts (its cache directory is made by `_prepare`)."""
        pod, need = placement.pod, placement.need
        assert isinstance(pod, VgpuPod)
        if need.name in pod.accounting:
            return pb.ContainerAllocateResponse()
        if self.mig is not None:
            return self._mig_response(self.mig, pod, need)
        if self.mps is not None:
            return self._mps_response(self.mps, pod, need)
        if not os.path.isfile(self._library):
            raise AllocateError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "hook-missing",
                f"pod {pod.display} container {need.name!r}: the HAMi-core library {self._library} is "
                f"missing on node {self.node_name} (install it under --hook-path)",
                pod,
            )
        made = self._made_for(pod, need)
        return self._build(pod, need, placement.gpus) if made is None else made.response

    def _build(
        self, pod: VgpuPod, need: ContainerNeed, gpus: Sequence[GpuInfo]
    ) -> pb.ContainerAllocateResponse:
        devices = self._devices(pod, need)
        mib = self.devices.layout.mib
        # Filled in place: a third of the time of building the same message from keyword
        # arguments. Entries are serialized in the order they are set.
        response = pb.ContainerAllocateResponse()
        envs = response.envs
        envs["NVIDIA_VISIBLE_DEVICES"] = self._visible(gpus)
        for i, device in enumerate(devices):
            envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{mib(device.memory)}m"
        envs["CUDA_DEVICE_SM_LIMIT"] = str(devices[0].cores)
        envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{hook.CONTAINER_CACHE_DIR}/{pod.uid}.cache"
        envs.update(self._node_envs)
        mounts = response.mounts  # `append` copies the shared mounts
        mounts.append(self._library_mount)
        mounts.add(
            container_path=hook.CONTAINER_CACHE_DIR,
            host_path=self.hook.container_path(pod.uid, need.name),
        )
        mounts.append(self._lock_mount)
        if need.name not in pod.uncontrolled:
            mounts.append(self._preload_mount)
        return response

    def _mig_response(
        self, cards: MigCards, pod: VgpuPod, need: ContainerNeed
    ) -> pb.ContainerAllocateResponse:
        """The MIG devices of the container's slots (partitioning an idle card into the group
        first) and nothing of HAMi-core: the hardware holds the container to its instance."""
        where = f"pod {pod.display} container {need.name!r}"
        uuids = []
        for device in self._devices(pod, need):
            card, group, position = decode_mig_id(device.uuid)  # read_vgpu_pod checked it
            try:
                mig_device = cards.device(
                    card, group, position, holds_pods=self._holds_pods, change=not self._rebuilding
                )
            except MigRefusal as err:
                raise AllocateError(err.code, err.reason, f"{where}: {err}", pod) from None
            uuids.append(mig_device.uuid)
        response = pb.ContainerAllocateResponse()
        response.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
        return response

    def _mps_response(
        self, daemons: MpsDaemons, pod: VgpuPod, need: ContainerNeed
    ) -> pb.ContainerAllocateResponse:
        """The container's one GPU through its MPS control daemon, whose limits are raised first to
        cover it: refused, with the daemon's answer, when the daemon does not take them."""
        where = f"pod {pod.display} container {need.name!r}"
        devices = self._devices(pod, need)
        if len(devices) != 1:
            raise AllocateError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "mps-one-gpu",
                f"{where}: {keys.DEVICES_TO_ALLOCATE} gives it {len(devices)} GPUs; on an mps node a "
                "container gets one (a CUDA process connects to one MPS control daemon, one per GPU)",
                pod,
            )
        (device,) = devices
        uuid = physical_uuid(device.uuid)
        memory = self.devices.layout.mib(device.memory)
        percent = vgpumps.thread_percentage(device.cores)
        if not self._rebuilding:  # a rebuilt row's container runs already, under limits set before
            memory_cap, percent_cap = vgpumps.ceiling(uuid, memory, percent, self.ledger.active())
            try:
                daemons.ceiling(uuid, memory_cap, percent_cap)
            except MpsError as err:
                raise AllocateError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "mps-down",
                    f"{where}: the MPS control daemon of GPU {uuid} does not take its limits: {err}",
                    pod,
                ) from None
        return vgpumps.response(daemons, uuid, memory, percent)

    def _holds_pods(self, uuid: str) -> bool:
        """Whether a live allocation (of any vGPU resource) holds the card."""
        return any(usage.uuid == uuid and usage.pods for usage in self.ledger.usage_by_gpu())

    def rebuilt(self, pod: Obj, container: str, device_ids: Sequence[str]) -> Allocation:
        """As `PodAllocator.rebuilt`; on a mig node the card must still hold the slot's group (a
        container that holds devices runs on it): it is never repartitioned for a rebuilt row; on an
        mps node the daemon's limits are left as they are."""
        self._rebuilding = True  # under `_lock`, as every Allocate
        try:
            return super().rebuilt(pod, container, device_ids)
        finally:
            self._rebuilding = False

    def _prepare(self, placement: Placement) -> None:
        assert isinstance(placement.pod, VgpuPod)
        if self.mode == keys.MODE_HAMI_CORE and placement.need.name not in placement.pod.accounting:
            self.hook.container_dir(placement.pod.uid, placement.need.name)

    def _as_written(self, pod: Obj) -> Obj:
        """Volcano writes `devices-to-allocate` as a copy of `vgpu-ids-new` with `bind-phase:
        allocating`; slots are emptied here as containers are served, `vgpu-ids-new` is kept."""
        notes = dict(objects.annotations_of(pod))
        if keys.VGPU_IDS_NEW in notes:
            notes[keys.DEVICES_TO_ALLOCATE] = notes[keys.VGPU_IDS_NEW]
        notes[keys.BIND_PHASE] = keys.BIND_PHASE_ALLOCATING
        return as_written(pod, notes)

    def _shares(self, placement: Placement) -> tuple[GpuShare, ...]:
        pod, need = placement.pod, placement.need
        assert isinstance(pod, VgpuPod)
        if need.name in pod.accounting:
            return ()
        made = self._made_for(pod, need)
        return self._shares_of(pod, need, placement.gpus) if made is None else made.shares

    def _shares_of(self, pod: VgpuPod, need: ContainerNeed, gpus: Sequence[GpuInfo]) -> tuple[GpuShare, ...]:
        layout = self.devices.layout
        return tuple(
            GpuShare(gpu.uuid, gpu.index, layout.mib(device.memory), device.cores)
            for gpu, device in zip(gpus, self._devices(pod, need), strict=True)
        )

    def _patches(self, placement: Placement, done: Container[Key]) -> list[Patch]:
        pod = placement.pod
        assert isinstance(pod, VgpuPod)
        if (pod.uid, placement.need.name, self.resource) not in pod.slot_keys:
            return []  # an accounting answer changes no slot
        # Every served slot emptied, not only this one: the cache may not yet show the previous
        # container's patch (of either resource), and the last patch sent must not bring its
        # slot back.
        slots = [() if key in done else slot for key, slot in zip(pod.slot_keys, pod.slots, strict=True)]
        annotations = {keys.DEVICES_TO_ALLOCATE: encode_pod_devices(slots)}
        if any(slot for slot in slots):
            return [Patch("pod", pod.namespace, pod.name, annotations, pod.uid)]
        annotations[keys.BIND_PHASE] = keys.BIND_PHASE_SUCCESS
        return [Patch("pod", pod.namespace, pod.name, annotations, pod.uid), self._unlock()]

    def _failure_patches(self, pod: PendingPod | None) -> list[Patch]:
        if pod is None:
            return [self._unlock()]
        failed = Patch("pod", pod.namespace, pod.name, {keys.BIND_PHASE: keys.BIND_PHASE_FAILED}, pod.uid)
        return [failed, self._unlock()]

    def _booking(self, pod: Obj, rows: Sequence[Allocation]) -> dict[str, str] | None:
        """`vgpu-ids-new` (what Volcano books) and `devices-to-allocate`: each slot from the row
        that served its container, or as written while the container waits; `bind-phase:
        success` once every slot is served."""
        try:
            owners = vgpu_slot_owners(pod)
            written = decode_pod_devices(objects.annotations_of(pod).get(keys.VGPU_IDS_NEW, ""))
        except FitInputError:
            return None
        if not owners or len(written) != len(owners):
            return None
        serving = {row.container: row for row in rows if row.gpus}
        layout = self.devices.layout
        booked: list[Sequence[Assigned]] = []
        waiting: list[Sequence[Assigned]] = []
        for owner, slot in zip(owners, written, strict=True):
            row = serving.get(owner.name)
            if row is None:
                booked.append(slot)
                waiting.append(slot)
                continue
            nvidia = keys.REQUEST_TYPE_NVIDIA
            if self.mig is not None:  # the row keeps no slot ID: the written one (see docs/mig.md)
                booked.append(slot)
            else:
                booked.append(
                    [Assigned(g.uuid, None, nvidia, layout.units(g.memory), g.cores) for g in row.gpus]
                )
            waiting.append([])
        annotations = {
            keys.VGPU_IDS_NEW: encode_pod_devices(booked),
            keys.DEVICES_TO_ALLOCATE: encode_pod_devices(waiting),
        }
        if not any(waiting):
            annotations[keys.BIND_PHASE] = keys.BIND_PHASE_SUCCESS
        return annotations
