"""What this node tells the scheduler through its Node object (SPEC §2, §5)."""

from __future__ import annotations

from collections.abc import Mapping

from deviceplugin.fit import keys
from deviceplugin.fit.codec import encode_node_register
from deviceplugin.fit.keys import Strategy
from deviceplugin.fit.model import GpuState
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.kube.node import NodeState
from deviceplugin.plugin.devices import RESOURCES, Layout


def wanted_node_state(
    strategy: Strategy, gpus: tuple[GpuInfo, ...], health: Mapping[str, bool], layout: Layout
) -> NodeState:
    """Every strategy: label `volcano.sh/gpu-strategy` = the strategy, so schedulers (the extender,
    kube-scheduler node affinity) offer a node only the pods its resources serve.
    share: node status `volcano.sh/gpu-number` = GPU count, so Volcano can derive memory per card.
    share and number: `volcano.sh/gpu-unhealthy-ids` lists unhealthy GPU indices (absent when none).
    vgpu: `volcano.sh/node-vgpu-register` describes every GPU, health included.
    Strategies advertising memory units: `volcano.sh/gpu-memory-factor` = MiB per unit."""
    annotations: dict[str, str | None] = {}
    resources: dict[str, str] = {}
    if strategy in ("share", "number"):
        unhealthy = [str(gpu.index) for gpu in gpus if not health.get(gpu.uuid, False)]
        annotations[keys.GPU_UNHEALTHY_IDS] = ",".join(unhealthy) or None
    else:
        annotations[keys.NODE_VGPU_REGISTER] = vgpu_register(gpus, health, layout)
    if any(resource.memory_based for resource in RESOURCES[strategy]):
        annotations[keys.GPU_MEMORY_FACTOR] = str(layout.factor)
    if strategy == "share":
        resources[keys.GPU_NUMBER] = str(len(gpus))
    return NodeState(annotations=annotations, resources=resources, labels={keys.GPU_STRATEGY_LABEL: strategy})


def vgpu_register(gpus: tuple[GpuInfo, ...], health: Mapping[str, bool], layout: Layout) -> str:
    """`UUID,split count,memory units,NVIDIA-<model>,health,hami-core:` per GPU, by index (SPEC §5).
    Memory is what the GPU offers (scaled, as HAMi registers it), so Volcano books up to that."""
    return encode_node_register(
        GpuState(
            index=gpu.index,
            uuid=gpu.uuid,
            type=f"NVIDIA-{gpu.model}",
            memory=layout.vgpu_memory_units(gpu),
            split_count=layout.split_count,
            health=health.get(gpu.uuid, False),
            mode=keys.MODE_HAMI_CORE,
        )
        for gpu in gpus
    )
