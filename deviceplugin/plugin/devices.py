"""Kubelet resources per strategy, their device IDs, and ListAndWatch messages as bytes.

A ListAndWatch message is a `ListAndWatchResponse`: field 1 repeated `Device{ID=1, health=2,
topology=3}`. With memory advertised as one device per memory unit a message holds up to ~160,000
devices, so it is encoded here directly from byte templates (one per run of IDs of equal length)
instead of building that many protobuf objects; tests check the bytes equal protobuf's own
serialization. Sizes are also computed arithmetically, so the memory factor can be chosen without
building anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from deviceplugin.api import HEALTHY, UNHEALTHY
from deviceplugin.fit.goint import is_decimal
from deviceplugin.fit.keys import Strategy
from deviceplugin.gpu.base import GpuInfo

IdPattern = Literal["index-unit", "uuid", "uuid-slot", "uuid-memory", "uuid-core"]

# The plugin keeps every message under this many bytes; kubelet's hard limit is 4 MiB.
MESSAGE_BUDGET = 3 * 1024 * 1024 + 512 * 1024
VGPU_CORES_PER_GPU = 100


@dataclass(frozen=True, slots=True)
class Resource:
    """One kubelet resource this node advertises, served on its own socket."""

    name: str
    socket: str
    pattern: IdPattern

    @property
    def memory_based(self) -> bool:
        return self.pattern in ("index-unit", "uuid-memory")


RESOURCES: Mapping[Strategy, tuple[Resource, ...]] = {
    "share": (Resource("volcano.sh/gpu-memory", "volcano.sock", "index-unit"),),
    "number": (Resource("volcano.sh/gpu-number", "volcano.sock", "uuid"),),
    "vgpu": (
        Resource("volcano.sh/vgpu-number", "nvidia-vgpu-number.sock", "uuid-slot"),
        Resource("volcano.sh/vgpu-memory", "nvidia-vgpu-memory.sock", "uuid-memory"),
        Resource("volcano.sh/vgpu-cores", "nvidia-vgpu-cores.sock", "uuid-core"),
    ),
    # NVIDIA's k8s-device-plugin's resource and socket name: a drop-in for its plugin
    "whole": (Resource("nvidia.com/gpu", "nvidia-gpu.sock", "uuid"),),
}


@dataclass(frozen=True, slots=True)
class Layout:
    """What decides the device IDs: memory unit (MiB per device), vGPU split count, and how much
    memory and compute each GPU offers in vGPU mode (HAMi's deviceMemoryScaling and
    deviceCoreScaling; above 1, HAMi-core oversubscribes the card)."""

    factor: int = 1
    split_count: int = 10
    memory_scaling: float = 1.0
    core_scaling: float = 1.0

    def mib(self, units: int) -> int:
        """Memory units (the devices of a memory resource, as annotations count them) in MiB."""
        return units * self.factor

    def units(self, mib: int) -> int:
        """MiB in whole memory units, rounded down."""
        return mib // self.factor

    def vgpu_memory_mib(self, gpu: GpuInfo) -> int:
        """The MiB a GPU offers to vGPU pods: its memory x scaling, truncated as HAMi's Go does."""
        return int(gpu.memory_mib * self.memory_scaling)

    def vgpu_memory_units(self, gpu: GpuInfo) -> int:
        """`vgpu-memory` devices, and the memory registered for Volcano, of one GPU."""
        return self.units(self.vgpu_memory_mib(gpu))

    @property
    def vgpu_cores(self) -> int:
        """`vgpu-cores` devices per GPU (the upstream plugin's int(100 x scaling))."""
        return int(VGPU_CORES_PER_GPU * self.core_scaling)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload


def _topology(numa: int | None) -> bytes:
    """`Device.topology` with one NUMA node; NUMANode.ID 0 is proto3's default and not encoded."""
    if numa is None:
        return b""
    node = b"\x08" + _varint(numa) if numa else b""
    return _field(3, _field(1, node))


@dataclass(frozen=True, slots=True)
class IdRun:
    """Device IDs `prefix + str(n)` for n in [start, stop) (all of equal length), or a single
    literal ID when `numbered` is False."""

    prefix: str
    start: int = 0
    stop: int = 1
    numbered: bool = True

    @property
    def count(self) -> int:
        return self.stop - self.start

    @property
    def id_length(self) -> int:
        return len(self.prefix) + (len(str(self.start)) if self.numbered else 0)

    def ids(self) -> Iterator[str]:
        if not self.numbered:
            yield self.prefix
            return
        for n in range(self.start, self.stop):
            yield f"{self.prefix}{n}"


def _numbered(prefix: str, count: int) -> list[IdRun]:
    """IDs prefix0 .. prefix{count-1}, split into runs of equal decimal width."""
    runs, start, width = [], 0, 10
    while start < count:
        stop = min(count, width)
        runs.append(IdRun(prefix, start, stop))
        start, width = stop, width * 10
    return runs


def id_runs(resource: Resource, gpu: GpuInfo, layout: Layout) -> list[IdRun]:
    """The device IDs one GPU contributes to a resource (SPEC §2)."""
    if resource.pattern == "index-unit":
        return _numbered(f"{gpu.index}-", layout.units(gpu.memory_mib))
    if resource.pattern == "uuid":
        return [IdRun(gpu.uuid, numbered=False)]
    if resource.pattern == "uuid-slot":
        return _numbered(f"{gpu.uuid}-", layout.split_count)
    if resource.pattern == "uuid-memory":
        return _numbered(f"{gpu.uuid}-memory-", layout.vgpu_memory_units(gpu))
    return _numbered(f"{gpu.uuid}-core-", layout.vgpu_cores)


def device_count(resource: Resource, gpu: GpuInfo, layout: Layout) -> int:
    return sum(run.count for run in id_runs(resource, gpu, layout))


def _tail(healthy: bool, numa: int | None) -> bytes:
    """Everything of a Device after its ID: health, then topology."""
    return _field(2, (HEALTHY if healthy else UNHEALTHY).encode()) + _topology(numa)


def _entry_length(id_length: int, tail_length: int) -> int:
    device = 1 + len(_varint(id_length)) + id_length + tail_length
    return 1 + len(_varint(device)) + device


def _encode_run(run: IdRun, tail: bytes) -> bytes:
    id_length = run.id_length
    device_length = 1 + len(_varint(id_length)) + id_length + len(tail)
    head = b"\x0a" + _varint(device_length) + b"\x0a" + _varint(id_length) + run.prefix.encode()
    if not run.numbered:
        return head + tail
    # head + n + tail for every n, built by one join and one replace in C rather than per entry.
    numbers = "\n".join(map(str, range(run.start, run.stop))).encode()
    return head + numbers.replace(b"\n", tail + head) + tail


def topology_of(resource: Resource, gpu: GpuInfo) -> int | None:
    """NUMA affinity is advertised for whole GPUs only: for shared slices it would make
    single-numa-node topology policies refuse pods for no real reason."""
    return gpu.numa if resource.pattern == "uuid" else None


def encode_gpu(resource: Resource, gpu: GpuInfo, layout: Layout, healthy: bool) -> bytes:
    """The encoded Device entries of one GPU: a slice of a ListAndWatchResponse."""
    tail = _tail(healthy, topology_of(resource, gpu))
    return b"".join(_encode_run(run, tail) for run in id_runs(resource, gpu, layout))


def message_size(resource: Resource, gpus: Sequence[GpuInfo], layout: Layout, healthy: bool = False) -> int:
    """Exact encoded size of the resource's ListAndWatchResponse; by default with every device
    Unhealthy, the longest the message can get."""
    total = 0
    for gpu in gpus:
        tail = len(_tail(healthy, topology_of(resource, gpu)))
        total += sum(run.count * _entry_length(run.id_length, tail) for run in id_runs(resource, gpu, layout))
    return total


class FactorError(ValueError):
    """The advertised device list cannot fit kubelet's message limit with this memory factor."""


def smallest_factor(
    resources: Sequence[Resource],
    gpus: Sequence[GpuInfo],
    split_count: int,
    *,
    memory_scaling: float = 1.0,
    core_scaling: float = 1.0,
) -> int:
    """The smallest memory factor keeping every resource's message within the budget."""

    def fits(factor: int) -> bool:
        layout = Layout(factor, split_count, memory_scaling, core_scaling)
        return all(message_size(r, gpus, layout) <= MESSAGE_BUDGET for r in resources)

    offered = Layout(1, split_count, memory_scaling)
    low, high = 1, max((max(g.memory_mib, offered.vgpu_memory_mib(g)) for g in gpus), default=1)
    if not fits(high):
        raise FactorError("no memory factor fits: the device list is over budget even at one device per GPU")
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return low


def check_layout(resources: Sequence[Resource], gpus: Sequence[GpuInfo], layout: Layout) -> None:
    """Refuse a layout whose messages could exceed the budget, naming the factor that fits."""
    for resource in resources:
        size = message_size(resource, gpus, layout)
        if size <= MESSAGE_BUDGET:
            continue
        if not resource.memory_based:
            raise FactorError(
                f"{resource.name}: the device list would be {size:,} bytes, over the {MESSAGE_BUDGET:,}-byte "
                "budget (kubelet accepts at most 4 MiB); lower --vgpu-split-count"
            )
        fitting = smallest_factor(
            resources,
            gpus,
            layout.split_count,
            memory_scaling=layout.memory_scaling,
            core_scaling=layout.core_scaling,
        )
        raise FactorError(
            f"{resource.name}: with --gpu-memory-factor={layout.factor} the device list would be "
            f"{size:,} bytes, over the {MESSAGE_BUDGET:,}-byte budget (kubelet accepts at most 4 MiB); "
            f"use --gpu-memory-factor={fitting} or more, or --gpu-memory-factor=auto"
        )
    for gpu in gpus:
        for resource in resources:
            if resource.memory_based and device_count(resource, gpu, layout) == 0:
                mib = gpu.memory_mib if resource.pattern == "index-unit" else layout.vgpu_memory_mib(gpu)
                raise FactorError(
                    f"--gpu-memory-factor={layout.factor} is larger than GPU {gpu.index}'s {mib} MiB"
                )


@dataclass
class DeviceList:
    """A resource's ListAndWatch message, rebuilt only when the health it depends on changes.

    Each GPU's encoded entries are kept for both health states, so a health change costs one join.
    """

    resource: Resource
    gpus: tuple[GpuInfo, ...]
    layout: Layout
    _chunks: dict[tuple[str, bool], bytes] = field(default_factory=dict, repr=False)
    _key: tuple[bool, ...] | None = field(default=None, repr=False)
    _message: bytes = field(default=b"", repr=False)
    # ID prefix (or the whole ID, for un-numbered IDs) -> its GPU and how many numbers follow it
    _owners: dict[str, tuple[GpuInfo, int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for gpu in self.gpus:
            runs = id_runs(self.resource, gpu, self.layout)
            if runs:
                count = sum(run.count for run in runs) if runs[0].numbered else 0
                self._owners[runs[0].prefix] = (gpu, count)

    def _chunk(self, gpu: GpuInfo, healthy: bool) -> bytes:
        key = (gpu.uuid, healthy)
        chunk = self._chunks.get(key)
        if chunk is None:
            chunk = self._chunks[key] = encode_gpu(self.resource, gpu, self.layout, healthy)
        return chunk

    def message(self, health: Mapping[str, bool]) -> bytes:
        """The encoded ListAndWatchResponse for this health (a GPU missing from `health` is
        Unhealthy)."""
        key = tuple(health.get(gpu.uuid, False) for gpu in self.gpus)
        if key != self._key:
            self._message = b"".join(self._chunk(g, ok) for g, ok in zip(self.gpus, key, strict=True))
            self._key = key
        return self._message

    def id_prefixes(self, indices: Iterable[int]) -> tuple[str, ...]:
        """What every device ID of these GPUs starts with (for un-numbered IDs, the whole ID)."""
        chosen = set(indices)
        return tuple(prefix for prefix, (gpu, _) in self._owners.items() if gpu.index in chosen)

    def gpu_of(self, device_id: str) -> GpuInfo | None:
        """The GPU a device ID of this resource belongs to, None when it is not one of ours."""
        if self.resource.pattern == "uuid":
            owner = self._owners.get(device_id)
            return None if owner is None else owner[0]
        prefix, dash, number = device_id.rpartition("-")
        owner = self._owners.get(prefix + dash)
        # Only the spelling ListAndWatch advertised: "0-7" is a device; "0-07", "0-+7" and a
        # 5,000-digit number (its length is checked before converting) are not.
        if owner is None or not is_decimal(number) or len(number) > len(str(owner[1])):
            return None
        return owner[0] if str(int(number)) == number and int(number) < owner[1] else None
