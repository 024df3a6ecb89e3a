"""Pieces of what a node tells the scheduler through its Node object (SPEC §2, §5); each device
family (`plugin.families`) puts its own together."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from deviceplugin.fit import keys
from deviceplugin.fit.codec import encode_node_register
from deviceplugin.fit.keys import Strategy
from deviceplugin.fit.model import GpuState
from deviceplugin.fit.topology import TOPOLOGY_KEY, Topology
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.kube.node import NodeState
from deviceplugin.plugin.devices import Layout, Resource


def node_state(
    strategy: Strategy,
    resources: tuple[Resource, ...],
    layout: Layout,
    annotations: Mapping[str, str | None],
    node_resources: Mapping[str, str] | None = None,
) -> NodeState:
    """A family's node state plus what every strategy publishes: the label
    `volcano.sh/gpu-strategy` = the strategy, so schedulers (the extender, kube-scheduler node
    affinity) offer a node only the pods its resources serve; and, when a resource advertises
    memory units, `volcano.sh/gpu-memory-factor` = MiB per unit."""
    notes = dict(annotations)
    if any(resource.memory_based for resource in resources):
        notes[keys.GPU_MEMORY_FACTOR] = str(layout.factor)
    return NodeState(
        annotations=notes, resources=dict(node_resources or {}), labels={keys.GPU_STRATEGY_LABEL: strategy}
    )


def with_topology(state: NodeState, topology: Topology | None) -> NodeState:
    """A family's node state plus what every node publishes beside it: `volcano.sh/gpu-topology`,
    how the GPUs it serves connect (docs/topology.md); a node that knows none removes the key, so
    a topology published before (other GPUs, another backend) is not left for the scheduler."""
    value = None if topology is None else topology.encode()
    return dataclasses.replace(state, annotations={**state.annotations, TOPOLOGY_KEY: value})


def unhealthy_ids(gpus: tuple[GpuInfo, ...], health: Mapping[str, bool]) -> str | None:
    """`volcano.sh/gpu-unhealthy-ids`: the unhealthy GPUs' indices (None, the key removed: none)."""
    return ",".join(str(gpu.index) for gpu in gpus if not health.get(gpu.uuid, False)) or None


def card_type(gpu: GpuInfo) -> str:
    """The card's type as `volcano.sh/node-vgpu-register` carries it (MIG geometries match on it)."""
    return f"NVIDIA-{gpu.model}"


def vgpu_register(
    gpus: tuple[GpuInfo, ...], health: Mapping[str, bool], layout: Layout, mode: str = keys.MODE_HAMI_CORE
) -> str:
    """`UUID,split count,memory units,NVIDIA-<model>,health,<mode>:` per GPU, by index (SPEC §5).
    Memory is what the GPU offers (scaled, as HAMi registers it), so Volcano books up to that.
    Every card carries the node's mode (`hami-core`, `mig`, `mps`), as the HAMi plugin writes it:
    Volcano takes the last card's for the whole node."""
    return encode_node_register(
        GpuState(
            index=gpu.index,
            uuid=gpu.uuid,
            type=card_type(gpu),
            memory=layout.vgpu_memory_units(gpu),
            split_count=layout.split_count,
            health=health.get(gpu.uuid, False),
            mode=mode,
        )
        for gpu in gpus
    )
