"""The node-side device families by strategy: the one place the daemon's strategy picks code
(docs/families.md).

A node runs one strategy: a family imports its allocator's module when it builds the allocator,
and a strategy is checked against this registry, not the scheduler side's (`fit.families`, which
loads every family's fit rules), so the daemon registers with kubelet sooner (bench/startup.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from deviceplugin.fit import keys
from deviceplugin.fit.errors import unknown_strategy
from deviceplugin.fit.keys import Strategy
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.mps import MpsDaemons
from deviceplugin.kube.node import NodeState
from deviceplugin.plugin.allocate import AccountingAllocator, Allocator
from deviceplugin.plugin.devices import RESOURCES, DeviceList, Layout, Resource
from deviceplugin.plugin.family import AllocatorParts, NodeFamily
from deviceplugin.plugin.nodestate import node_state, unhealthy_ids, vgpu_register
from deviceplugin.plugin.vgpumig import MigCards

if TYPE_CHECKING:
    from deviceplugin.plugin.gpushare import GpushareAllocator


class NumberNode:
    """`volcano.sh/gpu-number`: whole GPUs, one device per GPU; unhealthy GPUs listed by index."""

    strategy: Strategy = "number"
    uses_hook = False
    answers_handshake = False

    @property
    def mode(self) -> str:
        return self.strategy

    @property
    def resources(self) -> tuple[Resource, ...]:
        return RESOURCES[self.strategy]

    def node_state(self, gpus: tuple[GpuInfo, ...], health: Mapping[str, bool], layout: Layout) -> NodeState:
        return node_state(
            self.strategy, self.resources, layout, {keys.GPU_UNHEALTHY_IDS: unhealthy_ids(gpus, health)}
        )

    def allocator(self, devices: DeviceList, parts: AllocatorParts) -> Allocator | None:
        api = parts.api
        if api is None:
            return None
        return self._allocator_type()(
            devices, parts.health, api.pods, parts.ledger, api.events, topology=parts.topology, **api.options
        )

    def _allocator_type(self) -> type[GpushareAllocator]:
        from deviceplugin.plugin.gpushare import GpushareAllocator  # noqa: PLC0415  # see the docstring

        return GpushareAllocator


class ShareNode(NumberNode):
    """`volcano.sh/gpu-memory`: memory units; also the GPU count in the node's status
    (`volcano.sh/gpu-number`), from which Volcano derives memory per card."""

    strategy: Strategy = "share"

    def node_state(self, gpus: tuple[GpuInfo, ...], health: Mapping[str, bool], layout: Layout) -> NodeState:
        notes = {keys.GPU_UNHEALTHY_IDS: unhealthy_ids(gpus, health)}
        return node_state(self.strategy, self.resources, layout, notes, {keys.GPU_NUMBER: str(len(gpus))})


class WholeNode(NumberNode):
    """`nvidia.com/gpu`: whole GPUs as NVIDIA's device plugin advertises them (one device per GPU,
    its UUID), served as kubelet names them; unhealthy GPUs listed by index as number nodes do."""

    strategy: Strategy = "whole"

    def _allocator_type(self) -> type[GpushareAllocator]:
        from deviceplugin.plugin.whole import WholeAllocator  # noqa: PLC0415  # see the docstring

        return WholeAllocator


class VgpuNode:
    """HAMi's vGPU resources: count and memory matched to the pod's `devices-to-allocate`, cores
    accounted only; every GPU described in `volcano.sh/node-vgpu-register` with the node's
    operating mode (`hami-core`; `mig`: containers get MIG devices, docs/mig.md; `mps`: containers
    share each GPU through its MPS control daemon, docs/mps.md)."""

    strategy: Strategy = "vgpu"
    answers_handshake = True

    def __init__(self, mode: str = keys.MODE_HAMI_CORE) -> None:
        self.mode = mode

    @property
    def uses_hook(self) -> bool:
        return self.mode == keys.MODE_HAMI_CORE  # a MIG or MPS container gets no HAMi-core

    @property
    def resources(self) -> tuple[Resource, ...]:
        return RESOURCES[self.strategy]

    def node_state(self, gpus: tuple[GpuInfo, ...], health: Mapping[str, bool], layout: Layout) -> NodeState:
        notes = {keys.NODE_VGPU_REGISTER: vgpu_register(gpus, health, layout, self.mode)}
        return node_state(self.strategy, self.resources, layout, notes)

    def allocator(self, devices: DeviceList, parts: AllocatorParts) -> Allocator | None:
        from deviceplugin.plugin.vgpu import VgpuAllocator  # noqa: PLC0415  # see the docstring

        if devices.resource.name == keys.VGPU_CORES:  # the vgpu-number Allocate does the work
            return AccountingAllocator(devices, parts.stats)
        api = parts.api
        if api is None:
            return None
        return VgpuAllocator(  # vgpu-number, and vgpu-memory for a memory-only container's slot
            devices,
            parts.health,
            api.pods,
            parts.ledger,
            api.events,
            hook_path=parts.hook,
            disable_core_limit=parts.disable_core_limit,
            mig=self._mig(parts),
            mps=self._mps(parts),
            topology=parts.topology,
            **api.options,
        )

    def _mig(self, parts: AllocatorParts) -> MigCards | None:
        if self.mode != keys.MODE_MIG:
            return None
        if parts.mig is None:
            raise ValueError("a mig vGPU node's allocator needs its MIG cards (AllocatorParts.mig)")
        return parts.mig

    def _mps(self, parts: AllocatorParts) -> MpsDaemons | None:
        if self.mode != keys.MODE_MPS:
            return None
        if parts.mps is None:
            raise ValueError("an mps vGPU node's allocator needs its control daemons (AllocatorParts.mps)")
        return parts.mps


NODE_FAMILIES: Mapping[str, NodeFamily] = {
    family.strategy: family for family in (ShareNode(), NumberNode(), VgpuNode(), WholeNode())
}


def node_family_of(strategy: str, vgpu_mode: str = keys.MODE_HAMI_CORE) -> NodeFamily:
    """The family of `strategy` (a vGPU node in `vgpu_mode`); ConfigError naming the strategies
    for any other string (as the scheduler side's `fit.families.family_of` does, whose fit rules
    the node does not load)."""
    family = NODE_FAMILIES.get(strategy)
    if family is None:
        raise unknown_strategy(strategy)
    if family.strategy == "vgpu" and vgpu_mode != keys.MODE_HAMI_CORE:
        return VgpuNode(vgpu_mode)
    return family
