"""Which GPU-sharing strategy a node runs, read from what its plugin publishes, and its memory unit."""

from __future__ import annotations

from deviceplugin.fit import keys, node_strategy, objects
from deviceplugin.fit.codec import parse_memory_factor
from deviceplugin.fit.errors import AnnotationError
from deviceplugin.fit.strategy import STRATEGY_RESOURCES
from deviceplugin.inspect.model import Strategy

# The resource each strategy's node is recognised by (its plugin's first), for "no GPUs" messages.
GPU_RESOURCES = ", ".join(names[0] for names in STRATEGY_RESOURCES.values())


def detect_strategy(node: objects.Obj) -> Strategy:
    """The node's `volcano.sh/gpu-strategy` label, else what its plugin publishes (vgpu: the
    registration annotation or a vGPU resource; share: `gpu-memory`, with the `gpu-number` card
    count the plugin patches; number: `gpu-number` alone); none without GPU resources."""
    return node_strategy(node) or "none"


def memory_factor(node: objects.Obj) -> tuple[int, str | None]:
    """MiB per advertised memory unit (annotation `volcano.sh/gpu-memory-factor`, default 1), and a
    problem note when the annotation is unreadable (then 1 is assumed)."""
    value = objects.annotations_of(node).get(keys.GPU_MEMORY_FACTOR)
    try:
        return (1 if value is None else parse_memory_factor(value)), None
    except AnnotationError as err:
        return 1, f"{err}; 1 MiB per unit assumed"


def node_address(node: objects.Obj) -> str:
    """The node's InternalIP, else its first published address, else ""."""
    status = node.get("status")
    addresses = status.get("addresses") if isinstance(status, dict) else None
    if not isinstance(addresses, list):
        return ""
    entries = [entry for entry in addresses if isinstance(entry, dict)]
    for entry in entries:
        if entry.get("type") == "InternalIP":
            return str(entry.get("address") or "")
    return str(entries[0].get("address") or "") if entries else ""
