"""Filter: which nodes can take a GPU pod, and why the others cannot, for each strategy."""

from __future__ import annotations

import pytest

from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import (
    StartExtender,
    create_pod,
    eventually,
    gpu_pod,
    gpu_uuid,
    memory_pod,
    share_node,
    vgpu_node,
)

VGPU_1_8G = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "8000"}


def test_share_filter_passes_nodes_with_room_and_says_why_the_others_fail(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("roomy", gpus=2, memory=16000))
    apiserver.create("nodes", share_node("full", gpus=1, memory=16000))
    apiserver.create("nodes", {"metadata": {"name": "cpu-only"}, "status": {"capacity": {"cpu": "8"}}})
    create_pod(apiserver, memory_pod("hog", 12000, node="full", annotations={"volcano.sh/gpu-index": "0"}))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, memory_pod("new", 8000))

    result = ext.client.filter(pod, ["roomy", "full", "cpu-only", "ghost"])

    assert result["NodeNames"] == ["roomy"]
    assert result["Error"] == ""
    assert "8000" in result["FailedNodes"]["full"] and "4000 of 16000" in result["FailedNodes"]["full"]
    assert "no GPUs" in result["FailedAndUnresolvableNodes"]["cpu-only"]
    assert "not in the extender's node cache" in result["FailedAndUnresolvableNodes"]["ghost"]


def test_usage_follows_pods_as_they_come_and_go(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=1, memory=16000))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, memory_pod("new", 10000))
    assert ext.client.filter(pod, ["n1"])["NodeNames"] == ["n1"]

    create_pod(apiserver, memory_pod("other", 8000, node="n1", annotations={"volcano.sh/gpu-index": "0"}))
    eventually(lambda: ext.client.filter(pod, ["n1"])["NodeNames"] == [])

    apiserver.patch("pods", "other", {"status": {"phase": "Succeeded"}}, "default", subresource="status")
    eventually(lambda: ext.client.filter(pod, ["n1"])["NodeNames"] == ["n1"])  # terminal pods hold nothing

    create_pod(apiserver, memory_pod("third", 8000, node="n1", annotations={"volcano.sh/gpu-index": "0"}))
    eventually(lambda: ext.client.filter(pod, ["n1"])["NodeNames"] == [])
    apiserver.delete("pods", "third", "default")
    eventually(lambda: ext.client.filter(pod, ["n1"])["NodeNames"] == ["n1"])


def test_full_node_objects_get_node_objects_back(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """Without nodeCacheCapable, kube-scheduler sends and expects NodeList objects."""
    nodes = [apiserver.create("nodes", share_node(name, gpus=1, memory=16000)) for name in ("a", "b")]
    create_pod(apiserver, memory_pod("hog", 16000, node="b", annotations={"volcano.sh/gpu-index": "0"}))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, memory_pod("new", 1000))

    reply = ext.client.post("/filter", {"Pod": pod, "Nodes": {"items": nodes}})

    assert reply.status == 200
    assert [node["metadata"]["name"] for node in reply.body["Nodes"]["items"]] == ["a"]
    assert reply.body["NodeNames"] is None
    assert set(reply.body["FailedNodes"]) == {"b"}


def test_unhealthy_share_gpus_are_avoided(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("sick", gpus=2, memory=16000, unhealthy="0,1"))
    apiserver.create("nodes", share_node("half", gpus=2, memory=16000, unhealthy="0"))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, memory_pod("new", 1000))

    result = ext.client.filter(pod, ["sick", "half"])

    assert result["NodeNames"] == ["half"]
    assert "unhealthy" in result["FailedNodes"]["sick"]
    assert ext.client.bind(pod, "half") == ""
    bound = apiserver.get("pods", "new", "default")
    assert bound is not None and bound["metadata"]["annotations"]["volcano.sh/gpu-index"] == "1"


def test_a_gpu_turning_unhealthy_is_avoided_from_then_on(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=1, memory=16000))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, memory_pod("new", 1000))
    assert ext.client.filter(pod, ["n1"])["NodeNames"] == ["n1"]
    apiserver.patch("nodes", "n1", {"metadata": {"annotations": {"volcano.sh/gpu-unhealthy-ids": "0"}}})
    eventually(lambda: ext.client.filter(pod, ["n1"])["NodeNames"] == [])


def test_number_strategy_needs_idle_whole_gpus(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    # Number-mode nodes publish only the card count.
    apiserver.create("nodes", share_node("two-idle", gpus=2, memory_resource=False))
    apiserver.create("nodes", share_node("one-idle", gpus=2, memory_resource=False))
    create_pod(
        apiserver,
        gpu_pod(
            "tenant",
            {"volcano.sh/gpu-number": "1"},
            node="one-idle",
            annotations={"volcano.sh/gpu-index": "0"},
        ),
    )
    ext = start_extender(strategy="number")
    pod = create_pod(apiserver, gpu_pod("new", {"volcano.sh/gpu-number": "2"}))

    result = ext.client.filter(pod, ["two-idle", "one-idle"])

    assert result["NodeNames"] == ["two-idle"]
    assert "1 idle of 2" in result["FailedNodes"]["one-idle"]


def test_vgpu_filter_counts_memory_and_avoids_unhealthy_gpus(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", vgpu_node("ok", gpus=2, memory=16000, unhealthy=(0,)))
    apiserver.create("nodes", vgpu_node("sick", gpus=2, memory=16000, unhealthy=(0, 1)))
    apiserver.create("nodes", vgpu_node("busy", gpus=1, memory=16000))
    create_pod(
        apiserver,
        gpu_pod(
            "tenant",
            VGPU_1_8G | {"volcano.sh/vgpu-memory": "12000"},
            node="busy",
            annotations={"volcano.sh/vgpu-ids-new": f"{gpu_uuid('busy', 0)},NVIDIA,12000,0:"},
        ),
    )
    ext = start_extender(strategy="vgpu")
    pod = create_pod(apiserver, gpu_pod("new", VGPU_1_8G))

    result = ext.client.filter(pod, ["ok", "sick", "busy"])

    assert result["NodeNames"] == ["ok"]
    assert "unhealthy" in result["FailedNodes"]["sick"]
    assert "4000 of 16000 MiB free, needs 8000" in result["FailedNodes"]["busy"]
    assert ext.client.bind(pod, "ok") == ""
    bound = apiserver.get("pods", "new", "default")
    assert bound is not None
    assert (
        bound["metadata"]["annotations"]["volcano.sh/vgpu-ids-new"] == f"{gpu_uuid('ok', 1)},NVIDIA,8000,0:"
    )


def test_pod_without_gpu_request_passes_every_node(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1"))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, gpu_pod("cpu-job"))
    assert ext.client.filter(pod, ["n1", "anything"])["NodeNames"] == ["n1", "anything"]


@pytest.mark.parametrize(
    ("strategy", "limits", "expected"),
    [
        ("vgpu", {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-cores": "150"}, "a GPU has 100"),
        ("share", {"volcano.sh/gpu-memory": "1.5"}, "whole number"),
    ],
)
def test_an_unservable_pod_request_is_an_error_naming_the_pod(
    apiserver: ApiServerEmulator,
    start_extender: StartExtender,
    strategy: str,
    limits: dict[str, str],
    expected: str,
) -> None:
    apiserver.create("nodes", vgpu_node("n1") if strategy == "vgpu" else share_node("n1"))
    ext = start_extender(strategy=strategy)
    pod = create_pod(apiserver, gpu_pod("odd", limits))
    result = ext.client.filter(pod, ["n1"])
    assert result["NodeNames"] == []
    assert "default/odd" in result["Error"] and expected in result["Error"]


def test_a_node_with_an_unreadable_registration_is_reported(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    node = vgpu_node("garbled")
    node["metadata"]["annotations"]["volcano.sh/node-vgpu-register"] = "not,a,register"
    apiserver.create("nodes", node)
    ext = start_extender(strategy="vgpu")
    pod = create_pod(apiserver, gpu_pod("new", VGPU_1_8G))
    result = ext.client.filter(pod, ["garbled"])
    assert "garbled" in result["FailedAndUnresolvableNodes"]["garbled"]
