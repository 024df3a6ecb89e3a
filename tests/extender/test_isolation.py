"""One unreadable object costs only itself (issue 13, F1b and F2): a pod anywhere in the cluster
with a 4,301-digit `gpu-index` used to kill the cluster pod cache (no usage counted after it: the
extender overcommitted GPUs while `/readyz` said ok), and a node whose registration holds a
5,000-digit memory figure killed the node cache (no node known after it)."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import (
    Running,
    StartExtender,
    create_pod,
    eventually,
    gpu_pod,
    memory_pod,
    share_node,
    vgpu_node,
)

POISON = "9" * 4301  # one digit past what Python's int() converts
REGISTER = "volcano.sh/node-vgpu-register"
VGPU_1_8G = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "8000"}


def rejected(running: Running) -> dict[str, float]:
    """`volcano_gpu_extender_objects_rejected_total` by kind, from `/metrics`."""
    with urllib.request.urlopen(running.extender.url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        sample.labels["kind"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "volcano_gpu_extender_objects_rejected_total"
    }


def test_a_poison_pod_elsewhere_does_not_stop_usage_counting(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=1, memory=3000))
    apiserver.create("namespaces", {"metadata": {"name": "other"}})
    running = start_extender(strategy="share")
    poison = memory_pod("poison", 500, node="elsewhere", annotations={"volcano.sh/gpu-index": POISON})
    poison["metadata"]["namespace"] = "other"
    create_pod(apiserver, poison)
    create_pod(apiserver, memory_pod("real", 2011, node="n1", annotations={"volcano.sh/gpu-index": "0"}))
    client = running.client
    eventually(lambda: client.filter(memory_pod("probe", 2000), ["n1"])["NodeNames"] == [])  # 989 free
    assert client.filter(memory_pod("fits", 989), ["n1"])["NodeNames"] == ["n1"]
    apiserver.patch("pods", "poison", {"metadata": {"labels": {"touched": "yes"}}}, "other")
    create_pod(apiserver, memory_pod("later", 989, node="n1", annotations={"volcano.sh/gpu-index": "0"}))
    eventually(lambda: client.filter(memory_pod("probe", 1), ["n1"])["NodeNames"] == [])
    assert rejected(running)["pod"] == 1  # once, however often the pod changes
    assert client.request("GET", "/readyz").status == 200


def test_a_poison_pod_there_at_start_does_not_stop_the_pod_cache(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=1, memory=3000))
    create_pod(apiserver, memory_pod("poison", 500, node="n1", annotations={"volcano.sh/gpu-index": POISON}))
    create_pod(apiserver, memory_pod("real", 2011, node="n1", annotations={"volcano.sh/gpu-index": "0"}))
    running = start_extender(strategy="share")  # asserts the caches synced
    assert running.client.filter(memory_pod("probe", 990), ["n1"])["NodeNames"] == []
    assert running.client.filter(memory_pod("fits", 989), ["n1"])["NodeNames"] == ["n1"]
    assert rejected(running)["pod"] == 1


def poison_node(name: str) -> dict[str, object]:
    node = vgpu_node(name)
    notes = node["metadata"]["annotations"]
    notes[REGISTER] = notes[REGISTER].replace(",16000,", f",{'9' * 5000},", 1)
    return node


def test_a_node_with_a_huge_registration_costs_only_itself(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", poison_node("bad-at-start"))
    running = start_extender(strategy="vgpu")  # asserts the caches synced
    apiserver.create("nodes", poison_node("bad-later"))
    apiserver.create("nodes", vgpu_node("good"))
    eventually(lambda: running.sees_node("good"))
    pod = gpu_pod("job", VGPU_1_8G)
    result = running.client.filter(pod, ["bad-at-start", "bad-later", "good"])
    assert result["NodeNames"] == ["good"]
    assert sorted(result["FailedAndUnresolvableNodes"]) == ["bad-at-start", "bad-later"]
    assert rejected(running)["node"] == 2
    assert running.client.request("GET", "/readyz").status == 200


def test_an_unbookable_pod_is_reported_once_by_name_with_the_reason(
    apiserver: ApiServerEmulator, start_extender: StartExtender, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=1, memory=3000))
    create_pod(apiserver, memory_pod("poison", 500, node="n1", annotations={"volcano.sh/gpu-index": POISON}))
    running = start_extender(strategy="share")
    assert running.client.filter(memory_pod("whole", 3000), ["n1"])["NodeNames"] == ["n1"]  # books nothing
    reports = [r for r in caplog.records if r.getMessage() == "pod rejected"]
    assert [r.fields["pod"] for r in reports] == ["default/poison"]  # type: ignore[attr-defined]
    assert "a GPU index has at most 19" in reports[0].fields["reason"]  # type: ignore[attr-defined]
    assert rejected(running)["pod"] == 1
