"""What `inspect` reports: plain, immutable records built from the API objects, read by the printers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from deviceplugin.fit.topology import Topology

Strategy = Literal["share", "number", "vgpu", "whole", "none", "unknown"]
"""`none`: the node publishes no GPU resource; `unknown`: its object could not be read."""
PodState = Literal["assigned", "pending", "failed"]


@dataclass(frozen=True, slots=True)
class PodOnGpu:
    """One pod's share of one GPU. Memory in MiB (None in number mode); cores in percent (vGPU only)."""

    namespace: str
    name: str
    uid: str
    memory_mib: int | None
    cores: int | None
    state: PodState


@dataclass(frozen=True, slots=True)
class MigSlot:
    """A MIG slot a pod holds on a `mig` card: its geometry group and position there."""

    group: str
    position: int
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class GpuReport:
    """One GPU of a node. `memory_total_mib` is None where the node publishes no memory (number mode);
    `cores_*` and `pod_limit` are None outside vGPU mode; `uuid` and `model` only where published.
    `mode`: the vGPU sharing mode it registered (None outside vGPU); `mig_slots`: on a `mig` card,
    the slots its pods hold."""

    index: int
    uuid: str | None
    model: str | None
    healthy: bool
    memory_used_mib: int | None
    memory_total_mib: int | None
    cores_used: int | None
    cores_total: int | None
    pod_limit: int | None
    pods: tuple[PodOnGpu, ...]
    mode: str | None = None
    mig_slots: tuple[MigSlot, ...] = ()

    @property
    def pending(self) -> int:
        return sum(1 for pod in self.pods if pod.state == "pending")

    @property
    def allocated(self) -> bool:
        return bool(self.pods)


@dataclass(frozen=True, slots=True)
class NpuCardReport:
    """One Ascend card the HAMi Ascend device plugin registered (`chip`: its commonWord). Memory in
    MiB; cores are AI cores (percent on a `hami-core` node); `pod_limit` is its vNPU slots."""

    chip: str
    index: int
    id: str
    mode: str  # "template" or "hami-core"
    healthy: bool
    memory_used_mib: int
    memory_total_mib: int
    cores_used: int
    cores_total: int
    pod_limit: int
    pods: tuple[PodOnGpu, ...]

    @property
    def pending(self) -> int:
        return sum(1 for pod in self.pods if pod.state == "pending")


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One node: its strategy (detected from what it publishes), GPUs, and any problem reading it."""

    name: str
    address: str
    strategy: Strategy
    memory_factor: int
    gpus: tuple[GpuReport, ...]
    problems: tuple[str, ...]
    npus: tuple[NpuCardReport, ...] = ()
    #: The node publishes Ascend cards (or tries to: a malformed registration), so it is shown.
    ascend: bool = False
    #: How its GPUs connect (`volcano.sh/gpu-topology`); None when unpublished or unreadable.
    topology: Topology | None = None

    @property
    def memory_used_mib(self) -> int:
        return sum(gpu.memory_used_mib or 0 for gpu in self.gpus)

    @property
    def memory_total_mib(self) -> int:
        return sum(gpu.memory_total_mib or 0 for gpu in self.gpus)


@dataclass(frozen=True, slots=True)
class Ratio:
    allocated: int
    total: int

    @property
    def percent(self) -> int:
        """Whole percent, rounded down (as `kubectl inspect gpushare` does)."""
        return self.allocated * 100 // self.total if self.total else 0


@dataclass(frozen=True, slots=True)
class ClusterTotals:
    """Memory over the GPUs that publish memory; GPUs: allocated = at least one pod on it."""

    memory_mib: Ratio
    gpus: Ratio
    npu_memory_mib: Ratio = Ratio(0, 0)  # over the Ascend cards
    npus: Ratio = Ratio(0, 0)  # Ascend cards with at least one pod


@dataclass(frozen=True, slots=True)
class Report:
    nodes: tuple[NodeReport, ...]
    totals: ClusterTotals


def totals_of(nodes: tuple[NodeReport, ...]) -> ClusterTotals:
    gpus = [gpu for node in nodes for gpu in node.gpus]
    cards = [card for node in nodes for card in node.npus]
    return ClusterTotals(
        memory_mib=Ratio(
            sum(gpu.memory_used_mib or 0 for gpu in gpus if gpu.memory_total_mib is not None),
            sum(gpu.memory_total_mib or 0 for gpu in gpus),
        ),
        gpus=Ratio(sum(1 for gpu in gpus if gpu.allocated), len(gpus)),
        npu_memory_mib=Ratio(sum(c.memory_used_mib for c in cards), sum(c.memory_total_mib for c in cards)),
        npus=Ratio(sum(1 for card in cards if card.pods), len(cards)),
    )
