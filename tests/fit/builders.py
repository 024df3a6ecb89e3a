"""Builders for Kubernetes-shaped pod and node dicts used by the fit tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from deviceplugin.fit import GpuState, encode_node_register

Obj = dict[str, Any]

# vGPU resource names, short for request tables.
NUM = "volcano.sh/vgpu-number"
MEM = "volcano.sh/vgpu-memory"
PCT = "volcano.sh/vgpu-memory-percentage"
CORES = "volcano.sh/vgpu-cores"


def container(
    name: str = "main", limits: Mapping[str, Any] | None = None, requests: Mapping[str, Any] | None = None
) -> Obj:
    resources: Obj = {}
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None:
        resources["requests"] = dict(requests)
    return {"name": name, "resources": resources}


def pod(
    name: str = "pod",
    containers: Iterable[Obj] = (),
    *,
    init_containers: Iterable[Obj] = (),
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    namespace: str = "default",
    uid: str | None = None,
    phase: str = "Running",
    deleting: bool = False,
) -> Obj:
    metadata: Obj = {
        "name": name,
        "namespace": namespace,
        "uid": uid or f"uid-{name}",
        "annotations": dict(annotations or {}),
        "labels": dict(labels or {}),
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-21T10:00:00Z"
    spec: Obj = {"containers": list(containers)}
    inits = list(init_containers)
    if inits:
        spec["initContainers"] = inits
    return {"metadata": metadata, "spec": spec, "status": {"phase": phase}}


def limits_pod(name: str, limits: Mapping[str, Any], **kwargs: Any) -> Obj:
    """A pod with one container `main` limiting `limits`."""
    return pod(name, [container("main", limits)], **kwargs)


def gpushare_node(memory_total: int, number: int, unhealthy: str | None = None, name: str = "node-a") -> Obj:
    annotations = {} if unhealthy is None else {"volcano.sh/gpu-unhealthy-ids": unhealthy}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {
            "capacity": {"volcano.sh/gpu-memory": str(memory_total), "volcano.sh/gpu-number": str(number)},
            "allocatable": {"volcano.sh/gpu-memory": str(memory_total), "volcano.sh/gpu-number": str(number)},
        },
    }


def vgpu_node(
    register: str | Iterable[GpuState], name: str = "node-v", allocatable: Mapping[str, str] | None = None
) -> Obj:
    value = register if isinstance(register, str) else encode_node_register(register)
    default = {
        "volcano.sh/vgpu-number": "80",
        "volcano.sh/vgpu-memory": "100000",
        "volcano.sh/vgpu-cores": "800",
    }
    alloc = dict(allocatable) if allocatable is not None else default
    return {
        "metadata": {"name": name, "annotations": {"volcano.sh/node-vgpu-register": value}},
        "status": {"allocatable": alloc, "capacity": dict(alloc)},
    }


def gpus(*memories: int, kind: str = "NVIDIA-Tesla V100-PCIE-32GB", split: int = 10) -> list[GpuState]:
    """Idle healthy cards GPU-0..GPU-n with the given memories."""
    return [
        GpuState(index=i, uuid=f"GPU-{i}", type=kind, memory=m, split_count=split)
        for i, m in enumerate(memories)
    ]
