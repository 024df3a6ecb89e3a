"""The GPU backend interface: inventory, interconnect, Xid event wait, per-GPU probe, MIG partitioning.

Two implementations share it: `NvmlBackend` (the real driver through `pynvml`) and `FakeBackend`
(`--fake-gpus`, for tests and `simulate`). Everything above this package sees only these types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the daemon's option parsing reads this module; it needs no fit rules
    from deviceplugin.fit.model import MigGroup
    from deviceplugin.fit.topology import Topology


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


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device: a GPU instance with its one compute instance, as a container sees it."""

    gpu_instance: int  # GI id on its card
    compute_instance: int  # CI id within the GI
    profile: str  # NVIDIA's GPU-instance profile name, e.g. "3g.40gb"
    start: int  # placement start (memory slice) on the card
    memory_mib: int
    uuid: str  # "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"


@dataclass(frozen=True, slots=True)
class MigMatch:
    """A card's MIG devices matched to a geometry group: the group and its devices in slot order."""

    group: str
    devices: tuple[MigDevice, ...]


class MigError(Exception):
    """A MIG operation cannot be done; the message says why in a user's terms (unsupported
    model, unknown profile, no free placement, MIG mode off, the driver's error text)."""


class MigBusy(MigError):
    """The card's MIG instances cannot be destroyed: `device` is in use. Nothing was destroyed."""

    def __init__(self, message: str, device: MigDevice) -> None:
        super().__init__(message)
        self.device = device


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

    def topology(self, gpus: Sequence[GpuInfo]) -> Topology | None:
        """How these GPUs (enumerated by `inventory`) connect, and their NUMA nodes; None when the
        backend knows nothing of it. Never raises for a query that fails: that pair or GPU is
        described by the worst it could be (SYS, NUMA -1)."""
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

    # --- MIG: every call names a card by UUID and raises `MigError` when it cannot be done ----

    def mig_enabled(self, uuid: str) -> bool:
        """The card's current MIG mode (a pending change does not count until the GPU resets)."""
        ...

    def mig_devices(self, uuid: str) -> tuple[MigDevice, ...]:
        """The card's MIG devices by placement start; MigError when MIG mode is off."""
        ...

    def partition(self, uuid: str, group: MigGroup) -> tuple[MigDevice, ...]:
        """Create exactly the group's instances (one full compute instance each) on a card that
        holds none, at valid placements; the devices in slot order (the group's instance types in
        its order, each by position). On failure nothing created stays."""
        ...

    def clear_mig(self, uuid: str) -> None:
        """Destroy every MIG instance of the card; `MigBusy` (nothing destroyed) when one is in use."""
        ...

    def match_mig(self, uuid: str, groups: Sequence[MigGroup]) -> MigMatch | None:
        """The first group whose instance types and counts are exactly the card's MIG devices, with
        the devices in slot order; None when the card matches none (an empty card matches none)."""
        ...

    def close(self) -> None:
        """Release driver resources. Stop the event thread first; a `wait_event` racing with
        `close` returns None rather than raising, so shutdown is never mistaken for a fault."""
        ...
