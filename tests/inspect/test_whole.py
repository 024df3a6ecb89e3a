"""`inspect` on `whole` nodes (`nvidia.com/gpu`): whole cards, the pods on them as the extender books
them (by `gpu-index`, else by count on the first idle cards), unhealthy cards from the daemon's
`gpu-unhealthy-ids` or from allocatable falling short on NVIDIA's own plugin."""

from __future__ import annotations

import json

from deviceplugin.fit import keys
from kubesim.apiserver import ApiServerEmulator
from tests.inspect.cluster import add_pod, gpu_node, gpushare_pod
from tests.inspect.conftest import Inspect
from tests.inspect.table import read_table


def rows(out: str, node: str) -> list[tuple[str, str, str, str, str, str]]:
    return [
        (row["STRATEGY"], row["GPU"], row["MEMORY(MiB)"], row["PODS"], row["PENDING"], row["HEALTH"])
        for row in read_table(out)
        if row["NAME"] == node
    ]


def test_a_whole_node_shows_its_cards_and_pods(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    """GPUs 0,1 served to train-a; train-b placed without the extender, not yet served (booked on
    the first idle card); GPU 3 unhealthy."""
    node = gpu_node("gpu-whole-1", "10.0.0.50", {keys.NVIDIA_GPU: "4"}, {keys.GPU_UNHEALTHY_IDS: "3"})
    node["metadata"]["labels"] = {keys.GPU_STRATEGY_LABEL: "whole"}
    apiserver.create("nodes", node)
    add_pod(apiserver, gpushare_pod("train-a", "gpu-whole-1", keys.NVIDIA_GPU, 2, "0,1", True))
    served_later = gpushare_pod("train-b", "gpu-whole-1", keys.NVIDIA_GPU, 1, "0", False)
    del served_later["metadata"]["annotations"][keys.GPU_INDEX]
    add_pod(apiserver, served_later)
    run = inspect()
    assert run.code == 0, run.err
    assert rows(run.out, "gpu-whole-1") == [
        ("whole", "0", "-", "1", "0", "ok"),
        ("whole", "1", "-", "1", "0", "ok"),
        ("whole", "2", "-", "1", "1", "ok"),
        ("whole", "3", "-", "0", "0", "unhealthy"),
    ]
    assert "Allocated/Total GPUs In Cluster: 3/4 (75%)" in run.out
    (report,) = json.loads(inspect("-o", "json").out)["nodes"]
    assert (report["strategy"], report["problems"], report["memoryMiB"]) == ("whole", [], None)


def test_nvidia_plugin_node_marks_the_missing_cards_unhealthy(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    """NVIDIA's device plugin names no unhealthy GPU: kubelet only lowers allocatable."""
    node = gpu_node("gpu-nvidia-1", "10.0.0.51", {keys.NVIDIA_GPU: "2"})
    node["status"]["allocatable"][keys.NVIDIA_GPU] = "1"
    apiserver.create("nodes", node)
    assert [(gpu, health) for _, gpu, _, _, _, health in rows(inspect().out, "gpu-nvidia-1")] == [
        ("0", "ok"),
        ("1", "unhealthy"),
    ]
