"""What the daemon reports about itself, read in one go (`Daemon.snapshot()`): `/metrics` renders it
and knows nothing of the daemon's parts. Values are copies: the snapshot does not change after it
is taken. Memory is in the layout's units (`--gpu-memory-factor` MiB, Volcano's)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    uuid: str
    index: int
    healthy: bool
    memory_limit: int  # memory units offered, as registered with kubelet
    pods: int  # pods with an allocation on it
    memory: int  # memory units allocated
    cores: int  # percent allocated
    mode: str  # how it is shared (`NodeFamily.mode`): share, number, hami-core, mig


@dataclass(frozen=True, slots=True)
class PodOnGpu:
    uuid: str
    pod_name: str
    namespace: str
    memory: int  # memory units
    cores: int  # percent


@dataclass(frozen=True, slots=True)
class AllocateCounts:
    failures: Mapping[str, int]  # by reason
    mismatches: Mapping[str, int]  # kubelet's IDs not on the scheduler's GPUs, by resource
    resolved: Mapping[tuple[str, str], int]  # same-count pods told apart, by (resource, signal)
    swaps: Mapping[str, int]  # containers served as another pod, corrected; by resource
    waiting: Mapping[str, int]  # calls waiting for their pod now, by resource


@dataclass(frozen=True, slots=True)
class LedgerCounts:
    allocations: int  # live rows
    outbox_backlog: int  # API patches waiting to be sent
    storage_errors: Mapping[str, int]  # by problem


@dataclass(frozen=True, slots=True)
class ApiSide:
    """The parts that follow the API server (absent when no API is configured)."""

    pod_cache_staleness_s: float
    rejected: Mapping[str, int]  # objects its caches could not read, by kind
    outbox_batches: Mapping[str, int]  # by what started them
    outbox_entries: Mapping[str, int]  # by outcome


@dataclass(frozen=True, slots=True)
class DaemonSnapshot:
    node_name: str
    gpus: tuple[GpuSnapshot, ...]  # in the daemon's order
    pods: tuple[PodOnGpu, ...]  # by namespace, then pod name
    xid_events: Mapping[tuple[str, int], int]  # by (GPU UUID, Xid)
    allocate: AllocateCounts
    listandwatch_bytes: Mapping[str, int]  # current message size per served resource (in serving order)
    registrations: Mapping[str, int]  # successful registrations with kubelet, by resource
    ledger: LedgerCounts
    api: ApiSide | None
    worker_restarts: Mapping[str, int]  # by worker
    api_errors: Mapping[tuple[str, int], int] | None  # by (call, HTTP status or 0); None without an API
