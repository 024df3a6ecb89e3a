"""Which GPU strategy a node runs, and which one a pod's resources belong to.

A node runs one strategy (Volcano forbids mixing them on a node); only its own resources are
served there. A share-mode node shows `volcano.sh/gpu-number` in its capacity too (the card count
Volcano derives memory per card from) although no device plugin serves it: kubelet admits a pod
asking for it without calling a plugin, and the container gets no GPU. So a scheduler must match a
pod's resources with the node's strategy, not with the node's capacity.

This project's daemon names its strategy in the node label `volcano.sh/gpu-strategy`. A node
without the label (an older daemon, Volcano's own device plugins) is read from what its plugin
publishes. Volcano reads neither: these are for placing pods by strategy (the extender's default).
"""

from __future__ import annotations

from collections.abc import Mapping

from deviceplugin.fit import keys, objects
from deviceplugin.fit.errors import AnnotationError, RequestError
from deviceplugin.fit.keys import STRATEGIES, Strategy

# The pod resources each strategy's device plugin serves.
STRATEGY_RESOURCES: Mapping[Strategy, tuple[str, ...]] = {
    "share": (keys.GPU_MEMORY,),
    "number": (keys.GPU_NUMBER,),
    "vgpu": (keys.VGPU_NUMBER, keys.VGPU_MEMORY, keys.VGPU_MEMORY_PERCENTAGE, keys.VGPU_CORES),
    "whole": (keys.NVIDIA_GPU,),
}
_STRATEGY_OF = {resource: strategy for strategy, names in STRATEGY_RESOURCES.items() for resource in names}


def labelled_strategy(node: objects.Obj) -> Strategy | None:
    """The node's `volcano.sh/gpu-strategy` label; None without one. Raises AnnotationError
    naming the label when its value is no strategy."""
    value = objects.labels_of(node).get(keys.GPU_STRATEGY_LABEL)
    if value is None:
        return None
    for strategy in STRATEGIES:
        if value == strategy:
            return strategy
    raise AnnotationError(
        f"node label {keys.GPU_STRATEGY_LABEL}={value!r} is not a GPU strategy ({', '.join(STRATEGIES)})"
    )


def published_strategy(node: objects.Obj) -> Strategy | None:
    """The strategy what the node publishes tells: vgpu, the registration annotation or a vGPU
    resource; share, `gpu-memory` (beside the `gpu-number` card count its plugin patches); number,
    `gpu-number` alone; whole, `nvidia.com/gpu` and none of those (NVIDIA's own device plugin, or
    this project's daemon before it labelled the node). None: no GPU resource."""
    published = {
        **objects.status_resources(node, "capacity"),
        **objects.status_resources(node, "allocatable"),
    }
    if keys.NODE_VGPU_REGISTER in objects.annotations_of(node) or keys.VGPU_NUMBER in published:
        return "vgpu"
    if keys.GPU_MEMORY in published:
        return "share"
    if keys.GPU_NUMBER in published:
        return "number"
    if keys.NVIDIA_GPU in published:
        return "whole"
    return None


def node_strategy(node: objects.Obj) -> Strategy | None:
    """The node's label, else what it publishes (see the module's docstring); None: no GPUs."""
    return labelled_strategy(node) or published_strategy(node)


def pod_strategy(pod: objects.Obj) -> Strategy | None:
    """The strategy whose resources the pod's containers (init containers too) limit; None when it
    asks for no GPU resource. Raises RequestError when it asks for two strategies' resources: no
    node serves both."""
    asked: dict[Strategy, list[str]] = {}
    for container in (*objects.init_containers(pod), *objects.containers(pod)):
        for resource in objects.limits(container):
            strategy = _STRATEGY_OF.get(resource)
            if strategy is not None and resource not in asked.setdefault(strategy, []):
                asked[strategy].append(resource)
    if len(asked) > 1:
        mix = "; ".join(f"{', '.join(names)} ({strategy})" for strategy, names in asked.items())
        raise RequestError(
            f"pod {objects.display_name(pod)} asks for resources of {len(asked)} GPU strategies: {mix}; "
            "a node runs one strategy, so no node can serve the pod"
        )
    return next(iter(asked), None)
