"""GPU nodes and pods as the device plugin and the scheduler leave them, and one cluster of each
strategy loaded into the API-server emulator (numbers chosen so every total is easy to check)."""

from __future__ import annotations

from typing import Any

from deviceplugin.fit import keys
from kubesim.apiserver import ApiServerEmulator
from tests.fit.ascend_builders import registration
from tests.kube.objects import node_object, pod_object

Obj = dict[str, Any]

VGPU_REGISTER = (
    "GPU-aaaa-0001,10,20480,NVIDIA-A100,true,hami-core:GPU-bbbb-0002,10,20480,NVIDIA-A100,true,hami-core:"
)


def gpu_node(
    name: str,
    ip: str,
    capacity: dict[str, str],
    annotations: dict[str, str] | None = None,
) -> Obj:
    node = node_object(name)
    node["status"]["capacity"].update(capacity)
    node["status"]["allocatable"].update(capacity)
    node["status"]["addresses"] = [
        {"type": "Hostname", "address": name},
        {"type": "InternalIP", "address": ip},
    ]
    if annotations:
        node["metadata"]["annotations"] = dict(annotations)
    return node


def share_node(
    name: str, ip: str, gpus: int, units_per_gpu: int, annotations: dict[str, str] | None = None
) -> Obj:
    capacity = {keys.GPU_MEMORY: str(gpus * units_per_gpu), keys.GPU_NUMBER: str(gpus)}
    return gpu_node(name, ip, capacity, annotations)


def gpushare_pod(name: str, node: str, resource: str, amount: int, index: str, assigned: bool) -> Obj:
    pod = pod_object(name, node, namespace="ml")
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: str(amount)}}
    notes = {keys.GPU_INDEX: index, keys.PREDICATE_TIME: "1700000000000000000"}
    if assigned:
        notes[keys.GPU_ASSIGNED] = "true"
    pod["metadata"]["annotations"] = notes
    return pod


def vgpu_pod(name: str, node: str, devices: str, phase: str, count: int) -> Obj:
    pod = pod_object(name, node, namespace="ml")
    pod["spec"]["containers"][0]["resources"] = {"limits": {keys.VGPU_NUMBER: str(count)}}
    pod["metadata"]["annotations"] = {
        keys.VGPU_NODE: node,
        keys.VGPU_IDS_NEW: devices,
        keys.DEVICES_TO_ALLOCATE: devices,
        keys.BIND_PHASE: phase,
    }
    return pod


def add_pod(server: ApiServerEmulator, pod: Obj, phase: str = "Running") -> None:
    if server.get("namespaces", "ml") is None:
        server.create("namespaces", {"metadata": {"name": "ml"}})
    server.create("pods", pod)
    server.patch("pods", pod["metadata"]["name"], {"status": {"phase": phase}}, "ml", subresource="status")


def load_share(server: ApiServerEmulator) -> None:
    """gpu-share-1: 2 x 16384 MiB. GPU 0: 4096 (served) + 2048 (pending); GPU 1: 8192 (served);
    a Succeeded pod on GPU 1 holds nothing."""
    server.create("nodes", share_node("gpu-share-1", "10.0.0.11", 2, 16384))
    add_pod(server, gpushare_pod("train-a", "gpu-share-1", keys.GPU_MEMORY, 4096, "0", True))
    add_pod(server, gpushare_pod("train-b", "gpu-share-1", keys.GPU_MEMORY, 2048, "0", False))
    add_pod(server, gpushare_pod("infer-c", "gpu-share-1", keys.GPU_MEMORY, 8192, "1", True))
    add_pod(server, gpushare_pod("done-d", "gpu-share-1", keys.GPU_MEMORY, 1000, "1", True), "Succeeded")


def load_number(server: ApiServerEmulator) -> None:
    """gpu-number-1: 4 GPUs, GPU 3 unhealthy. batch-e holds GPUs 0,1; batch-f (pending) GPU 2."""
    capacity = {keys.GPU_NUMBER: "4"}
    server.create("nodes", gpu_node("gpu-number-1", "10.0.0.12", capacity, {keys.GPU_UNHEALTHY_IDS: "3"}))
    add_pod(server, gpushare_pod("batch-e", "gpu-number-1", keys.GPU_NUMBER, 2, "0,1", True))
    add_pod(server, gpushare_pod("batch-f", "gpu-number-1", keys.GPU_NUMBER, 1, "2", False))


def load_vgpu(server: ApiServerEmulator) -> None:
    """gpu-vgpu-1: memory factor 2, so each 20480-unit GPU has 40960 MiB.
    GPU 0: vg-g 10240 MiB 30% (success), vg-h 4096 MiB 20% (allocating), vg-i 2048 MiB 10%;
    GPU 1: vg-i 2048 MiB 10% (vg-i has one device on each GPU)."""
    capacity = {keys.VGPU_NUMBER: "20", keys.VGPU_MEMORY: "40960", keys.VGPU_CORES: "200"}
    notes = {keys.NODE_VGPU_REGISTER: VGPU_REGISTER, keys.GPU_MEMORY_FACTOR: "2"}
    server.create("nodes", gpu_node("gpu-vgpu-1", "10.0.0.13", capacity, notes))
    add_pod(server, vgpu_pod("vg-g", "gpu-vgpu-1", "GPU-aaaa-0001,NVIDIA,5120,30:", "success", 1))
    add_pod(server, vgpu_pod("vg-h", "gpu-vgpu-1", "GPU-aaaa-0001,NVIDIA,2048,20:", "allocating", 1))
    devices = "GPU-aaaa-0001,NVIDIA,1024,10:GPU-bbbb-0002,NVIDIA,1024,10:"
    add_pod(server, vgpu_pod("vg-i", "gpu-vgpu-1", devices, "success", 2))


def load_cluster(server: ApiServerEmulator) -> None:
    """All three strategies plus a node without GPUs."""
    server.create("nodes", node_object("cpu-1"))
    load_share(server)
    load_number(server)
    load_vgpu(server)


def ascend_node(name: str, ip: str, register: str, *, hami_core: bool = False) -> Obj:
    """A node as HAMi's Ascend device plugin leaves it: 7 vNPU slots per card in allocatable, its
    registration and `hami-vnpu-core`."""
    return gpu_node(
        name,
        ip,
        {"huawei.com/Ascend310P": "14"},
        {"hami.io/node-register-Ascend310P": register, "hami-vnpu-core": "true" if hami_core else "false"},
    )


def npu_pod(name: str, node: str, allocated: str, phase: str) -> Obj:
    """A pod the extender (or Volcano) bound to Ascend cards: its ledger value and bind phase."""
    pod = pod_object(name, node, namespace="ml")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"huawei.com/Ascend310P": "1"}}
    pod["metadata"]["annotations"] = {
        "hami.io/Ascend310P-devices-allocated": allocated,
        "hami.io/bind-phase": phase,
    }
    return pod


def load_ascend(server: ApiServerEmulator) -> None:
    """npu-1: cards NPU-A and NPU-B (21527 MiB, 8 AI cores, 7 slots). NPU-A: npu-a vir02 6144 MiB
    (success) and npu-b vir01 3072 MiB (allocating); NPU-B idle; a Succeeded pod holds nothing."""
    server.create("nodes", ascend_node("npu-1", "10.0.0.14", registration("NPU-A", "NPU-B")))
    add_pod(server, npu_pod("npu-a", "npu-1", "NPU-A,Ascend310P,6144,0:;", "success"))
    add_pod(server, npu_pod("npu-b", "npu-1", "NPU-A,Ascend310P,3072,0:;", "allocating"))
    add_pod(server, npu_pod("npu-done", "npu-1", "NPU-B,Ascend310P,3072,0:;", "success"), "Succeeded")
