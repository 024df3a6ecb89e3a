"""What each container of a pod received, checked against what the scheduler wrote and what the pod
asked for. Independent of the plugin's code: it reads kubelet's admission records (the Allocate
responses) and the pod's annotations, and states the protocol's rules itself.

A container's env and mounts are what kubelet hands the runtime: the responses of its resources in
allocation order, the first value of an env var or mount path winning (kubelet logs a conflict and
keeps the first; here a conflict is a failure).

Rules (memory requests and annotations count units of the node's memory factor F MiB; F is 1
unless the node says otherwise):

- `volcano.sh/gpu-memory` M: `NVIDIA_VISIBLE_DEVICES` names the one GPU of the pod's
  `volcano.sh/gpu-index` (by UUID or index), `VOLCANO_GPU_ALLOCATED` = M x F, `VOLCANO_GPU_MEMORY_TOTAL`
  and `VOLCANO_GPU_TOTAL` = that GPU's MiB.
- `volcano.sh/gpu-number` N: the container's slice of `gpu-index` (app containers take consecutive
  GPUs in container order, init containers start from the first), `VOLCANO_GPU_ALLOCATED` = N.
- `nvidia.com/gpu` N (a `whole` node, docs/whole.md): as `gpu-number`; the plugin serves the GPUs
  kubelet named and rewrites `gpu-index` to them, so the slice rule holds after it served the pod.
- vGPU (an app container limiting `volcano.sh/vgpu-number` N, or `vgpu-memory` alone: 1): the
  container's entry of `volcano.sh/vgpu-ids-new` (entries follow the app containers that ask, in
  order) holds N devices; `NVIDIA_VISIBLE_DEVICES` names exactly their UUIDs;
  each device's memory = the request (`vgpu-memory`, else `vgpu-memory-percentage` of the card,
  else the whole card) and `CUDA_DEVICE_MEMORY_LIMIT_<i>` = that x F MiB; `CUDA_DEVICE_SM_LIMIT` = the cores
  asked (`vgpu-cores`, default 0); HAMi-core's library is mounted.
- vGPU on a `mig` node (docs/mig.md): each device of the entry is a MIG slot
  `GPU-<uuid>[<group>-<pos>]` on a GPU of the node, booking the request's memory; the container's
  env is only `NVIDIA_VISIBLE_DEVICES`, N distinct `MIG-` UUIDs; nothing of HAMi-core is mounted.
- vGPU on an `mps` node (docs/mps.md): the entry holds one GPU of the node (an MPS client talks to
  one GPU's control daemon), booking the request's memory and cores; the env is exactly
  `NVIDIA_VISIBLE_DEVICES` = its UUID, `CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps`,
  `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` = the cores asked (none: 100) and
  `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<memory x F>M`; the mounts are exactly `/tmp/nvidia-mps`
  from that GPU's pipe directory `<root>/<uuid>/pipe`, where its control daemon listens (`control`),
  and `/dev/shm` from `<root>/shm`, both read-write; nothing of HAMi-core.
- A container asking for no GPU gets no `NVIDIA_VISIBLE_DEVICES` from a plugin.
- The plugin marks the pod served: `gpu-assigned: "true"` (share, number, whole), `bind-phase: success`
  (vGPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deviceplugin.fit import keys, objects
from deviceplugin.fit.codec import decode_mig_id, decode_pod_devices, parse_gpu_index
from deviceplugin.fit.errors import FitInputError
from deviceplugin.fit.model import Assigned
from deviceplugin.fit.quantity import parse_quantity
from deviceplugin.plugin.hook import CONTAINER_LIBRARY
from kubesim.admission import Admission
from kubesim.nodes import FakeGpu, NodeSpec

Obj = Mapping[str, Any]

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
MPS_PIPE = "/tmp/nvidia-mps"  # MPS's default pipe directory, where a client looks for its daemon
MPS_SHM = "/dev/shm"
#: What only the scheduler (or the plugin after it) writes on a pod.
SCHEDULER_OWNED = (
    keys.GPU_INDEX,
    keys.PREDICATE_TIME,
    keys.GPU_ASSIGNED,
    keys.VGPU_IDS_NEW,
    keys.DEVICES_TO_ALLOCATE,
    keys.BIND_PHASE,
    keys.BIND_TIME,
    keys.VGPU_NODE,
    keys.VGPU_TIME,
)


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass
class ContainerView:
    """What kubelet hands the runtime for one container."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    #: The resources kubelet allocated devices of (a plugin on the node served them).
    allocated: list[str] = field(default_factory=list)


def received(pod: Obj, admission: Admission | None) -> tuple[list[ContainerView], list[str]]:
    """Every container (init containers first, in spec order) with what kubelet gives it; and the
    conflicts between the responses of its resources."""
    views = {
        objects.container_name(c): ContainerView(objects.container_name(c))
        for c in [*objects.init_containers(pod), *objects.containers(pod)]
    }
    conflicts: list[str] = []
    first_from: dict[tuple[str, str], str] = {}
    for allocation in admission.allocations if admission is not None and admission.admitted else ():
        view = views.setdefault(allocation.container, ContainerView(allocation.container))
        view.allocated.append(allocation.resource)
        for name, value in allocation.envs.items():
            if name in view.env and view.env[name] != value:
                conflicts.append(
                    f"container {view.name}: {name} is {view.env[name]!r} from "
                    f"{first_from[(view.name, name)]} and {value!r} from {allocation.resource}; "
                    "kubelet keeps the first"
                )
            elif name not in view.env:
                view.env[name] = value
                first_from[(view.name, name)] = allocation.resource
        paths = {mount.container_path for mount in view.mounts}
        for mount in allocation.mounts:
            if mount.container_path not in paths:
                view.mounts.append(Mount(mount.container_path, mount.host_path, mount.read_only))
    return list(views.values()), conflicts


def verify(pod: Obj, views: Sequence[ContainerView], node: NodeSpec) -> list[str]:
    """What does not match, one line each naming the pod, the container and the values."""
    checker = _Checker(pod, {view.name: view for view in views}, node)
    return checker.run()


def own_scheduler_annotations(submitted: Obj, placed: Obj) -> list[str]:
    """The pod came with annotations only the scheduler writes. Volcano neither reads a pending
    pod's `gpu-index` nor keeps it: its bind writes its own choice over it (a JSON patch `add`),
    and so does the extender's Binding; say so rather than let it pass."""
    given = objects.annotations_of(submitted)
    now = objects.annotations_of(placed)
    problems = []
    for key in SCHEDULER_OWNED:
        if key in given:
            after = f"; the scheduler wrote {now[key]!r}" if key in now and now[key] != given[key] else ""
            problems.append(
                f"{objects.namespaced_name(submitted)}: its own {key}={given[key]!r} is not honoured: the "
                f"scheduler owns that annotation and overwrites it at bind{after} (choose GPUs with "
                f"{keys.USE_GPUTYPE} / {keys.VGPU_USE_UUID} instead)"
            )
    return problems


class _Checker:
    def __init__(self, pod: Obj, views: Mapping[str, ContainerView], node: NodeSpec) -> None:
        self.pod = pod
        self.views = views
        self.node = node
        self.by_uuid = {gpu.uuid: gpu for gpu in node.gpus}
        self.by_index = {str(gpu.index): gpu for gpu in node.gpus}
        self.notes = objects.annotations_of(pod)
        self.display = objects.namespaced_name(pod)
        self.problems: list[str] = []

    def wrong(self, container: str, text: str) -> None:
        self.problems.append(f"{self.display} container {container}: {text}")

    def run(self) -> list[str]:
        gpushare_asked = vgpu_asked = False
        number_offset = 0
        vgpu_entry = 0
        init_names = {objects.container_name(c) for c in objects.init_containers(self.pod)}
        for container in [*objects.init_containers(self.pod), *objects.containers(self.pod)]:
            name = objects.container_name(container)
            limits = objects.limits(container)
            view = self.views.get(name, ContainerView(name))
            memory = _whole(limits.get(keys.GPU_MEMORY))
            number = _whole(limits.get(keys.GPU_NUMBER))
            gpus = _whole(limits.get(keys.NVIDIA_GPU))
            if memory:
                gpushare_asked = True
                self._gpushare(view, keys.GPU_MEMORY, memory, 0)
            elif number:
                gpushare_asked = True
                start = 0 if name in init_names else number_offset
                self._gpushare(view, keys.GPU_NUMBER, number, start)
                if name not in init_names:
                    number_offset += number
            elif gpus:
                gpushare_asked = True
                self._gpushare(view, keys.NVIDIA_GPU, gpus, 0 if name in init_names else number_offset)
                if name not in init_names:
                    number_offset += gpus
            elif name not in init_names and (keys.VGPU_NUMBER in limits or keys.VGPU_MEMORY in limits):
                vgpu_asked = True
                self._vgpu(view, limits, vgpu_entry)
                vgpu_entry += 1
            elif VISIBLE in view.env and name not in init_names:
                self.wrong(name, f"asks for no GPU but got {VISIBLE}={view.env[VISIBLE]}")
        if self.problems:  # what the containers lack says more than the bookkeeping after it
            return self.problems
        if gpushare_asked and self.notes.get(keys.GPU_ASSIGNED) != "true":
            self.problems.append(f"{self.display}: the plugin never marked it {keys.GPU_ASSIGNED}=true")
        if vgpu_asked and self.notes.get(keys.BIND_PHASE) != keys.BIND_PHASE_SUCCESS:
            phase = self.notes.get(keys.BIND_PHASE)
            self.problems.append(
                f"{self.display}: {keys.BIND_PHASE} is {phase!r}, not {keys.BIND_PHASE_SUCCESS!r}"
            )
        return self.problems

    def _named(self, view: ContainerView, resource: str, asks: str) -> list[FakeGpu] | None:
        """The GPUs `NVIDIA_VISIBLE_DEVICES` names; None (with a problem) when it is missing or odd."""
        value = view.env.get(VISIBLE)
        if not value:
            why = f"{asks} but got no GPU (no {VISIBLE})"
            if resource not in view.allocated:
                node = f"{self.node.strategy} node {self.node.name}"
                why += f": kubelet allocated no {resource}, no plugin on {node} serves it"
            self.wrong(view.name, why)
            return None
        named = []
        for item in value.split(","):
            gpu = self.by_uuid.get(item) or self.by_index.get(item)
            if gpu is None:
                self.wrong(view.name, f"{VISIBLE}={value} names {item!r}, which is no GPU of its node")
                return None
            named.append(gpu)
        return named

    def _gpushare(self, view: ContainerView, resource: str, units: int, start: int) -> None:
        """A gpu-memory container lives on one GPU; a gpu-number container on `units` from `start`."""
        asks = f"asks {resource}={units}"
        named = self._named(view, resource, asks)
        if named is None:
            return
        wanted = self._chosen(view, named, resource=resource, units=units, start=start)
        if wanted is None:
            return
        if [gpu.index for gpu in named] != wanted:
            got = ",".join(str(gpu.index) for gpu in named)
            self.wrong(
                view.name,
                f"{VISIBLE} names GPU(s) {got}; the scheduler's {keys.GPU_INDEX} gives it "
                f"{','.join(map(str, wanted))}",
            )
        factor = self.node.memory_factor if resource == keys.GPU_MEMORY else 1
        expected = {"VOLCANO_GPU_ALLOCATED": str(units * factor)}
        expected |= dict.fromkeys(("VOLCANO_GPU_MEMORY_TOTAL", "VOLCANO_GPU_TOTAL"), str(named[0].memory_mib))
        for env, value in expected.items():
            if view.env.get(env) != value:
                self.wrong(view.name, f"{env}={view.env.get(env)!r}, wanted {value!r} ({asks})")

    def _chosen(
        self, view: ContainerView, named: Sequence[FakeGpu], *, resource: str, units: int, start: int
    ) -> list[int] | None:
        """The GPU indices the scheduler's `gpu-index` gives the container; None (with a problem)
        when it cannot say. A gpu-number pod bound without one gets the GPUs kubelet picked, as
        NVIDIA's plugin serves it: then only their count is the scheduler's."""
        asks = f"asks {resource}={units}"
        width = 1 if resource == keys.GPU_MEMORY else units
        value = self.notes.get(keys.GPU_INDEX)
        if value is None:
            if resource != keys.GPU_MEMORY and len({gpu.index for gpu in named}) == width:
                return [gpu.index for gpu in named]
            self.wrong(
                view.name,
                f"{asks}; it got GPUs {view.env[VISIBLE]} but the scheduler wrote no {keys.GPU_INDEX}",
            )
            return None
        try:
            index = parse_gpu_index(value)
        except FitInputError as err:
            self.wrong(view.name, f"{asks} but {keys.GPU_INDEX} cannot be read: {err}")
            return None
        if len(index) < start + width:
            self.wrong(view.name, f"{asks} but {keys.GPU_INDEX}={value} lists too few GPUs")
            return None
        return index[start : start + width]

    def _entry(self, view: ContainerView, asks: str, entry: int, count: int) -> list[Assigned] | None:
        """The container's entry of `vgpu-ids-new`, of `count` devices; None (with a problem) if not."""
        try:
            entries = decode_pod_devices(self.notes[keys.VGPU_IDS_NEW])
        except KeyError:
            self.wrong(view.name, f"{asks}; it got GPUs but the scheduler wrote no {keys.VGPU_IDS_NEW}")
            return None
        except FitInputError as err:
            self.wrong(view.name, f"{asks} but {keys.VGPU_IDS_NEW} cannot be read: {err}")
            return None
        devices: list[Assigned] = entries[entry] if entry < len(entries) else []
        if len(devices) != count:
            self.wrong(view.name, f"{asks}; entry {entry} of {keys.VGPU_IDS_NEW} holds {len(devices)}")
            return None
        return devices

    def _vgpu(self, view: ContainerView, limits: Obj, entry: int) -> None:
        count = _whole(limits.get(keys.VGPU_NUMBER)) if keys.VGPU_NUMBER in limits else 1
        asks = f"asks {count} vGPU(s)"
        if self.node.mode == keys.MODE_MIG:
            self._mig(view, limits, entry, count)
            return
        if self.node.mode == keys.MODE_MPS:
            self._mps(view, limits, entry, count)
            return
        named = self._named(view, keys.VGPU_NUMBER, asks)
        if named is None:
            return
        devices = self._entry(view, asks, entry, count)
        if devices is None:
            return
        wanted = [device.uuid for device in devices]
        if [gpu.uuid for gpu in named] != wanted:
            got = ",".join(gpu.uuid for gpu in named)
            self.wrong(
                view.name, f"{VISIBLE}={got}; the scheduler's {keys.VGPU_IDS_NEW} gives it {','.join(wanted)}"
            )
        cores = _whole(limits.get(keys.VGPU_CORES))
        for i, device in enumerate(devices):
            gpu = self.by_uuid.get(device.uuid)
            if gpu is None:
                self.wrong(
                    view.name, f"{keys.VGPU_IDS_NEW} names {device.uuid}, no GPU of node {self.node.name}"
                )
                continue
            factor = self.node.memory_factor
            memory = _vgpu_memory(limits, gpu.memory_mib // factor)
            limit = view.env.get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}")
            if device.memory != memory or limit != f"{memory * factor}m":
                self.wrong(
                    view.name,
                    f"CUDA_DEVICE_MEMORY_LIMIT_{i}={limit!r} and the scheduler's {device.memory} unit(s) of "
                    f"{factor} MiB; the request gives {memory} unit(s), {memory * factor}m",
                )
            if device.cores != cores:
                self.wrong(
                    view.name, f"the scheduler booked {device.cores}% of GPU {gpu.index}; it asks {cores}%"
                )
        if view.env.get("CUDA_DEVICE_SM_LIMIT") != str(cores):
            self.wrong(
                view.name, f"CUDA_DEVICE_SM_LIMIT={view.env.get('CUDA_DEVICE_SM_LIMIT')!r}; it asks {cores}%"
            )
        if not any(mount.container_path == CONTAINER_LIBRARY for mount in view.mounts):
            self.wrong(
                view.name, f"HAMi-core's library is not mounted at {CONTAINER_LIBRARY}: no limit is enforced"
            )

    def _mig(self, view: ContainerView, limits: Obj, entry: int, count: int) -> None:
        """A container on a `mig` node: its MIG devices only, one per slot of its entry."""
        asks = f"asks {count} vGPU(s) on mig node {self.node.name}"
        visible = view.env.get(VISIBLE, "")
        uuids = visible.split(",") if visible else []
        if len(uuids) != count or len(set(uuids)) != count or not all(u.startswith("MIG-") for u in uuids):
            self.wrong(view.name, f"{asks} but got {VISIBLE}={visible!r}, not {count} distinct MIG device(s)")
        devices = self._entry(view, asks, entry, count)
        if devices is None:
            return
        for device in devices:
            try:
                card, _group, _position = decode_mig_id(device.uuid)
            except FitInputError as err:
                self.wrong(view.name, f"{keys.VGPU_IDS_NEW} holds {device.uuid}, no MIG slot: {err}")
                continue
            gpu = self.by_uuid.get(card)
            if gpu is None:
                self.wrong(view.name, f"{keys.VGPU_IDS_NEW} names {card}, no GPU of node {self.node.name}")
                continue
            memory = _vgpu_memory(limits, gpu.memory_mib // self.node.memory_factor)
            if device.memory != memory:
                self.wrong(
                    view.name,
                    f"the scheduler booked {device.memory} unit(s) in slot {device.uuid}; "
                    f"the request gives {memory}",
                )
        extra = sorted(set(view.env) - {VISIBLE})
        if extra:
            self.wrong(view.name, f"a MIG device is its own limit, yet it got {', '.join(extra)}")
        if any(mount.container_path == CONTAINER_LIBRARY for mount in view.mounts):
            self.wrong(view.name, f"HAMi-core's library is mounted at {CONTAINER_LIBRARY} on a MIG device")

    def _mps(self, view: ContainerView, limits: Obj, entry: int, count: int) -> None:
        """A container on an `mps` node: one GPU, its limits as MPS reads them, the GPU's pipe
        directory and the daemon's shared memory mounted."""
        asks = f"asks {count} vGPU(s) on mps node {self.node.name}"
        devices = self._entry(view, asks, entry, count)
        if devices is None:
            return
        if count != 1:
            self.wrong(view.name, f"{asks} and was admitted, yet an MPS client talks to one GPU's daemon")
            return
        device = devices[0]
        gpu = self.by_uuid.get(device.uuid)
        if gpu is None:
            self.wrong(view.name, f"{keys.VGPU_IDS_NEW} names {device.uuid}, no GPU of node {self.node.name}")
            return
        factor = self.node.memory_factor
        memory = _vgpu_memory(limits, gpu.memory_mib // factor)
        cores = _whole(limits.get(keys.VGPU_CORES))
        if (device.memory, device.cores) != (memory, cores):
            self.wrong(
                view.name,
                f"the scheduler booked {device.memory} unit(s) and {device.cores}% of GPU {gpu.index}; "
                f"it asks {memory} and {cores}%",
            )
        wanted = {
            VISIBLE: gpu.uuid,
            "CUDA_MPS_PIPE_DIRECTORY": MPS_PIPE,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(cores if 0 < cores <= 100 else 100),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={memory * factor}M",
        }
        for name in sorted(wanted.keys() | view.env.keys()):
            if view.env.get(name) != wanted.get(name):
                self.wrong(view.name, f"{name}={view.env.get(name)!r}, wanted {wanted.get(name)!r} ({asks})")
        mounts = {mount.container_path: mount for mount in view.mounts}
        pipe, shm = mounts.pop(MPS_PIPE, None), mounts.pop(MPS_SHM, None)
        if pipe is None or pipe.read_only or Path(pipe.host_path).parts[-2:] != (gpu.uuid, "pipe"):
            self.wrong(
                view.name,
                f"{MPS_PIPE} is mounted from {_shown(pipe)}, not GPU {gpu.index}'s pipe directory "
                f"<root>/{gpu.uuid}/pipe (rw)",
            )
        elif not (Path(pipe.host_path) / "control").is_socket():
            self.wrong(view.name, f"no MPS control daemon listens in {pipe.host_path}, the pipe it mounts")
        elif shm is None or shm.read_only or Path(shm.host_path) != Path(pipe.host_path).parents[1] / "shm":
            root = Path(pipe.host_path).parents[1]
            self.wrong(view.name, f"{MPS_SHM} is mounted from {_shown(shm)}, not {root / 'shm'} (rw)")
        if mounts:
            extra = ", ".join(mounts)
            self.wrong(view.name, f"an MPS client mounts only its pipe and shm, yet it got {extra}")


def _shown(mount: Mount | None) -> str:
    return "nowhere" if mount is None else f"{mount.host_path} ({'ro' if mount.read_only else 'rw'})"


def _whole(value: object) -> int:
    if value is None:
        return 0
    try:
        return int(parse_quantity(value))
    except FitInputError:
        return 0


def _vgpu_memory(limits: Obj, card_units: int) -> int:
    """Memory units per vGPU the request gives: `vgpu-memory`, else a percentage of the card, else
    all of it."""
    if keys.VGPU_MEMORY in limits:
        return _whole(limits[keys.VGPU_MEMORY])
    if keys.VGPU_MEMORY_PERCENTAGE in limits:
        return card_units * _whole(limits[keys.VGPU_MEMORY_PERCENTAGE]) // 100
    return card_units
