"""The extender on an `mps` node (docs/mps.md, "One GPU per container"): a node registered as a
`--vgpu-mode mps` daemon writes it takes containers of one GPU, never one of two or more (its daemon
would refuse it, `mps-one-gpu`), so such a pod goes to a node that can serve it. Under
compat="volcano" the card reads as `hami-core`, as Volcano's scheduler reads it."""

from __future__ import annotations

from deviceplugin.fit import Compat
from deviceplugin.fit import keys as k
from deviceplugin.gpu.base import GpuInfo
from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import Running, StartExtender, create_pod, eventually, gpu_pod
from tests.extender.test_mig import daemon_node

A10S = tuple(GpuInfo(i, f"GPU-7e2d0c4f-a10a-4b1b-8e3e-a10mps00000{i}", "NVIDIA A10", 23028) for i in range(2))
T4S = tuple(GpuInfo(i, f"GPU-1b2c3d4e-t400-4b1b-8e3e-t4hamicore0{i}", "Tesla T4", 15360) for i in range(2))


def two_node_extender(apiserver: ApiServerEmulator, start_extender: StartExtender, compat: Compat) -> Running:
    apiserver.create("nodes", daemon_node("mps", A10S, k.MODE_MPS))
    apiserver.create("nodes", daemon_node("shared", T4S, k.MODE_HAMI_CORE))
    ext = start_extender(strategy="vgpu", compat=compat)
    eventually(lambda: ext.sees_node("mps") and ext.sees_node("shared"))
    return ext


def test_a_container_of_two_gpus_is_not_sent_to_an_mps_node(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    ext = two_node_extender(apiserver, start_extender, None)
    one = create_pod(apiserver, gpu_pod("one", {k.VGPU_NUMBER: "1", k.VGPU_MEMORY: "1000"}))
    two = create_pod(apiserver, gpu_pod("two", {k.VGPU_NUMBER: "2", k.VGPU_MEMORY: "1000"}))
    assert ext.client.filter(one, ["mps", "shared"])["NodeNames"] == ["mps", "shared"]
    answer = ext.client.filter(two, ["mps", "shared"])
    assert answer["NodeNames"] == ["shared"]
    assert "runs mps, which serves a container one GPU; it asks for 2" in answer["FailedNodes"]["mps"]
    asks_mps = create_pod(
        apiserver,
        gpu_pod(
            "two-mps", {k.VGPU_NUMBER: "2", k.VGPU_MEMORY: "1000"}, annotations={k.VGPU_MODE: k.MODE_MPS}
        ),
    )
    assert ext.client.filter(asks_mps, ["mps", "shared"])["NodeNames"] == []


def test_volcano_compat_reads_the_mps_node_as_hami_core(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    ext = two_node_extender(apiserver, start_extender, "volcano")
    two = create_pod(apiserver, gpu_pod("two", {k.VGPU_NUMBER: "2", k.VGPU_MEMORY: "1000"}))
    assert ext.client.filter(two, ["mps", "shared"])["NodeNames"] == ["mps", "shared"]
