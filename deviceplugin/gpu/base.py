"""The GPU backend interface: inventory, Xid event wait, per-GPU probe.

Two implementations share it: `NvmlBackend` (the real driver through `pynvml`) and `FakeBackend`
(`--fake-gpus`, for tests and `simulate`). Everything above this package sees only these types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU as enumerated."""

    index: int  # NVML index
    uuid: str  # "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    model: str  # NVML product name, e.g. "NVIDIA A100-SXM4-80GB"
    memory_mib: int
    minor: int | None = None  # /dev/nvidia<minor>
    pci_bus_id: str | None = None  # NVML form "00000000:3B:00.0"
    numa: int | None = None  # NUMA node of the PCI device; None when unknown
    mig_enabled: bool = False


@dataclass(frozen=True, slots=True)
class EnumerationError:
    """A GPU that could not be enumerated; the others still are."""

    index: int
    message: str


@dataclass(frozen=True, slots=True)
class Inventory:
    gpus: tuple[GpuInfo, ...]
    errors: tuple[EnumerationError, ...] = ()


@dataclass(frozen=True, slots=True)
class XidEvent:
    """A critical Xid error reported by the driver. `uuid` is None when the device is unknown."""

    uuid: str | None
    xid: int


class BackendError(Exception):
    """The backend cannot work at all (driver missing, NVML init failed, bad fake spec)."""


class WaitError(BackendError):
    """Waiting for events failed (not a timeout): health can no longer be observed."""


class GpuBackend(Protocol):
    """What the daemon needs from a GPU source. Implementations must be thread-safe for one
    event-waiting thread plus calls from other threads to `probe` and `watch` (a `watch` may wait
    for an in-progress `wait_event` to return)."""

    def inventory(self) -> Inventory:
        """Enumerate the GPUs; a GPU that fails is reported in `errors`, not raised."""
        ...

    def watch(self, uuids: tuple[str, ...]) -> dict[str, str]:
        """Start receiving Xid events for these GPUs. Returns {uuid: problem} for GPUs whose
        events could not be registered (they must be treated as unhealthy). A GPU that does not
        support events is not a problem: it is logged and stays healthy."""
        ...

    def wait_event(self, timeout_s: float) -> XidEvent | None:
        """Block up to `timeout_s` for the next Xid event; None on timeout. Raises `WaitError`."""
        ...

    def probe(self, uuid: str) -> bool:
        """Whether the GPU answers a cheap query now (used to return a GPU to Healthy)."""
        ...

    def close(self) -> None:
        """Release driver resources. Stop the event thread first; a `wait_event` racing with
        `close` returns None rather than raising, so shutdown is never mistaken for a fault."""
        ...
