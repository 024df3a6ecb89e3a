"""What this node tells the scheduler through its Node object (SPEC §2, §5)."""

from __future__ import annotations

from collections.abc import Mapping

from deviceplugin.fit import keys
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.kube.node import NodeState
from deviceplugin.plugin.devices import RESOURCES, Layout, Strategy


def wanted_node_state(
    strategy: Strategy, gpus: tuple[GpuInfo, ...], health: Mapping[str, bool], layout: Layout
) -> NodeState:
    """share: node status `volcano.sh/gpu-number` = GPU count, so Volcano can derive memory per card.
    share and number: `volcano.sh/gpu-unhealthy-ids` lists unhealthy GPU indices (absent when none).
    Strategies advertising memory units: `volcano.sh/gpu-memory-factor` = MiB per unit."""
    annotations: dict[str, str | None] = {}
    resources: dict[str, str] = {}
    if strategy in ("share", "number"):
        unhealthy = [str(gpu.index) for gpu in gpus if not health.get(gpu.uuid, False)]
        annotations[keys.GPU_UNHEALTHY_IDS] = ",".join(unhealthy) or None
    if any(resource.memory_based for resource in RESOURCES[strategy]):
        annotations[keys.GPU_MEMORY_FACTOR] = str(layout.factor)
    if strategy == "share":
        resources[keys.GPU_NUMBER] = str(len(gpus))
    return NodeState(annotations=annotations, resources=resources)
