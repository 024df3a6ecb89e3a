"""The node-side interface of a device family: one implementation per GPU strategy.

The daemon picks its family once, from `--gpu-strategy` (`plugin.families.node_family_of`), and
asks it everything that differs by strategy: the kubelet resources it serves, what the node
publishes, which allocator answers each resource's Allocate (how that allocator reads a pod and
what a container gets) and which extra parts run. The scheduler-side half is
`deviceplugin.fit.family`; docs/families.md says how a new family plugs in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from deviceplugin.fit.keys import Strategy
from deviceplugin.fit.topology import Topology
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.health import HealthState
from deviceplugin.gpu.mps import MpsDaemons
from deviceplugin.kube.events import EventRecorder
from deviceplugin.kube.node import NodeState
from deviceplugin.kube.podcache import PodCache
from deviceplugin.ledger import Ledger
from deviceplugin.plugin.allocate import AllocationStats, Allocator
from deviceplugin.plugin.devices import DeviceList, Layout, Resource
from deviceplugin.plugin.hook import HookPath
from deviceplugin.plugin.vgpumig import MigCards


@dataclass(frozen=True, slots=True)
class PodApi:
    """The API side an allocator that matches Allocate to pods needs."""

    pods: PodCache
    events: EventRecorder
    options: Mapping[str, Any]  # PodAllocator's keyword options (node name, timeouts, stats, ...)


@dataclass(frozen=True, slots=True)
class AllocatorParts:
    """What the daemon hands a family to build one resource's allocator."""

    health: HealthState
    ledger: Ledger
    stats: AllocationStats
    hook: HookPath
    disable_core_limit: bool
    api: PodApi | None  # None: no Kubernetes API, so no pod can be identified
    mig: MigCards | None = None  # a mig vGPU node's cards, over the GPU backend
    mps: MpsDaemons | None = None  # an mps vGPU node's control daemons
    topology: Topology | None = None  # how the node's GPUs connect, for multi-GPU choices


class NodeFamily(Protocol):
    """One GPU strategy as the node daemon serves it."""

    @property
    def strategy(self) -> Strategy:
        """The strategy (the node label's value)."""

    @property
    def mode(self) -> str:
        """How the node's GPUs are shared: the strategy, or a vGPU node's operating mode
        (`hami-core`, `mig`, `mps`); shown per GPU in the metrics."""

    @property
    def resources(self) -> tuple[Resource, ...]:
        """The kubelet resources it advertises, one plugin socket each."""

    @property
    def uses_hook(self) -> bool:
        """Containers get HAMi-core's cache directories under --hook-path (prepared at start,
        dropped once no live allocation mounts them)."""

    @property
    def answers_handshake(self) -> bool:
        """The node answers Volcano's vGPU handshake annotation."""

    def node_state(self, gpus: tuple[GpuInfo, ...], health: Mapping[str, bool], layout: Layout) -> NodeState:
        """What the node publishes on its Node object."""

    def allocator(self, devices: DeviceList, parts: AllocatorParts) -> Allocator | None:
        """What answers Allocate for `devices.resource`; None when it needs the API and there is none."""
