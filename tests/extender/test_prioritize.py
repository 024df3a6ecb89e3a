"""Prioritize: binpack fills used GPUs first, spread prefers idle ones; weight scales or disables."""

from __future__ import annotations

import pytest

from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import (
    Obj,
    StartExtender,
    create_pod,
    eventually,
    gpu_pod,
    gpu_uuid,
    memory_pod,
    share_node,
    vgpu_node,
)


def _best(scores: dict[str, int]) -> str:
    top = max(scores.values())
    winners = [host for host, score in scores.items() if score == top]
    assert len(winners) == 1, scores
    return winners[0]


def _share_cluster(apiserver: ApiServerEmulator) -> Obj:
    apiserver.create("nodes", share_node("busy", gpus=1, memory=16000))
    apiserver.create("nodes", share_node("idle", gpus=1, memory=16000))
    create_pod(apiserver, memory_pod("tenant", 8000, node="busy", annotations={"volcano.sh/gpu-index": "0"}))
    return create_pod(apiserver, memory_pod("new", 4000))


def _vgpu_cluster(apiserver: ApiServerEmulator) -> Obj:
    apiserver.create("nodes", vgpu_node("busy", gpus=1, memory=16000))
    apiserver.create("nodes", vgpu_node("idle", gpus=1, memory=16000))
    limits = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "4000"}
    notes = {"volcano.sh/vgpu-ids-new": f"{gpu_uuid('busy', 0)},NVIDIA,8000,0:"}
    create_pod(apiserver, gpu_pod("tenant", limits, node="busy", annotations=notes))
    return create_pod(apiserver, gpu_pod("new", limits))


@pytest.mark.parametrize("strategy", ["share", "vgpu"])
def test_binpack_and_spread_choose_different_nodes(
    apiserver: ApiServerEmulator, start_extender: StartExtender, strategy: str
) -> None:
    pod = _vgpu_cluster(apiserver) if strategy == "vgpu" else _share_cluster(apiserver)
    binpack = start_extender(strategy=strategy, policy="binpack")
    spread = start_extender(strategy=strategy, policy="spread")
    nodes = ["busy", "idle"]

    assert binpack.client.filter(pod, nodes)["NodeNames"] == nodes
    packed = binpack.client.prioritize(pod, nodes)
    assert spread.client.filter(pod, nodes)["NodeNames"] == nodes
    spreaded = spread.client.prioritize(pod, nodes)

    assert _best(packed) == "busy"
    assert _best(spreaded) == "idle"
    assert all(0 <= score <= 10 for score in (*packed.values(), *spreaded.values()))


def test_prioritize_without_a_filter_first_gives_the_same_scores(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    pod = _share_cluster(apiserver)
    ext = start_extender(strategy="share", policy="binpack")
    cold = ext.client.prioritize(pod, ["busy", "idle"])
    ext.client.filter(pod, ["busy", "idle"])
    assert ext.client.prioritize(pod, ["busy", "idle"]) == cold


def test_weight_zero_turns_scoring_off_and_weight_scales_up_to_the_cap(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    pod = _share_cluster(apiserver)
    off = start_extender(strategy="share", policy="binpack", weight=0)
    single = start_extender(strategy="share", policy="binpack", weight=1)
    double = start_extender(strategy="share", policy="binpack", weight=2)
    nodes = ["busy", "idle"]
    assert off.client.prioritize(pod, nodes) == {"busy": 0, "idle": 0}
    one, two = single.client.prioritize(pod, nodes), double.client.prioritize(pod, nodes)
    # binpack on the card after placement: busy 12000/16000 = 75 -> 8, idle 4000/16000 = 25 -> 3
    assert one == {"busy": 8, "idle": 3}
    assert two == {"busy": 10, "idle": 6}


def test_nodes_that_do_not_fit_score_zero(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", share_node("small", gpus=1, memory=2000))
    ext = start_extender(strategy="share", policy="spread")
    pod = create_pod(apiserver, memory_pod("new", 4000))
    assert ext.client.prioritize(pod, ["small", "unknown"]) == {"small": 0, "unknown": 0}


def test_a_node_that_changed_since_filter_is_scored_as_it_is_now(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """Prioritize reuses filter's fits only for nodes unchanged since: a pod bound to one of them
    in between makes it score as the fuller node it now is."""
    apiserver.create("nodes", share_node("a", gpus=1, memory=16000))
    apiserver.create("nodes", share_node("b", gpus=1, memory=16000))
    ext = start_extender(strategy="share", policy="binpack")
    pod = create_pod(apiserver, memory_pod("new", 4000))
    assert ext.client.filter(pod, ["a", "b"])["NodeNames"] == ["a", "b"]
    assert ext.client.prioritize(pod, ["a", "b"]) == {"a": 3, "b": 3}  # 4000/16000 each
    create_pod(apiserver, memory_pod("tenant", 8000, node="a", annotations={"volcano.sh/gpu-index": "0"}))
    # a: 12000/16000 after placement, once the extender has seen the tenant (a stale fit never is)
    eventually(lambda: ext.client.prioritize(pod, ["a", "b"]) == {"a": 8, "b": 3})


def test_a_node_whose_pods_came_and_went_since_filter_is_scored_as_it_is_now(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """Pods bound and one gone again leave the node changed: its state is never taken for one a
    filter saw before (a change count that returned to an earlier value would be)."""
    apiserver.create("nodes", share_node("a", gpus=1, memory=16000))
    ext = start_extender(strategy="share", policy="binpack")
    first = create_pod(apiserver, memory_pod("first", 4000))
    assert ext.client.filter(first, ["a"])["NodeNames"] == ["a"]  # on the idle node
    on_gpu_0 = {"volcano.sh/gpu-index": "0"}
    gone = create_pod(apiserver, memory_pod("gone", 8000, node="a", annotations=on_gpu_0))
    eventually(lambda: ext.client.filter(memory_pod("probe", 8001), ["a"])["NodeNames"] == [])  # gone seen
    second = create_pod(apiserver, memory_pod("second", 4000))
    assert ext.client.filter(second, ["a"])["NodeNames"] == ["a"]  # beside 'gone'
    create_pod(apiserver, memory_pod("stays", 4000, node="a", annotations=on_gpu_0))
    eventually(lambda: ext.client.filter(memory_pod("probe", 4001), ["a"])["NodeNames"] == [])  # stays seen
    apiserver.delete("pods", gone["metadata"]["name"], "default")
    eventually(lambda: ext.client.filter(memory_pod("probe", 8000), ["a"])["NodeNames"] == ["a"])  # gone left
    for pod in (first, second):  # 4000 + 4000 of 16000 after placement
        assert ext.client.prioritize(pod, ["a"]) == {"a": 5}


def test_a_two_gpu_vgpu_pod_scores_the_average_of_its_gpus(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """A 2-GPU pod's score is its GPUs' average, as for a 1-GPU pod: the sum would reach the cap of
    10 on any node past half full and stop telling nodes apart."""
    apiserver.create("nodes", vgpu_node("idle", gpus=2, memory=16000))
    apiserver.create("nodes", vgpu_node("half", gpus=2, memory=16000))
    apiserver.create("nodes", vgpu_node("full", gpus=2, memory=16000))
    for node, used in (("half", 8000), ("full", 12000)):
        both = "".join(f"{gpu_uuid(node, i)},NVIDIA,{used},0:" for i in range(2))
        limits = {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": str(used)}
        notes = {"volcano.sh/vgpu-ids-new": both}
        create_pod(apiserver, gpu_pod(f"tenant-{node}", limits, node=node, annotations=notes))
    ext = start_extender(strategy="vgpu", policy="binpack")
    limits = {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": "4000"}
    pod = create_pod(apiserver, gpu_pod("new", limits))
    nodes = ["idle", "half", "full"]
    assert ext.client.filter(pod, nodes)["NodeNames"] == nodes
    # binpack on each card after placement: 25, 75 and 100 per GPU, the same on both
    assert ext.client.prioritize(pod, nodes) == {"idle": 3, "half": 8, "full": 10}
