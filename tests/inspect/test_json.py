"""`-o json`: the documented document shape, with the same numbers as the text report."""

from __future__ import annotations

import json
from typing import Any

from kubesim.apiserver import ApiServerEmulator
from tests.inspect.cluster import load_cluster
from tests.inspect.conftest import Inspect


def _document(inspect: Inspect, *args: str) -> dict[str, Any]:
    run = inspect("-o", "json", *args)
    assert run.code == 0, run.err
    document: dict[str, Any] = json.loads(run.out)
    return document


def _node(document: dict[str, Any], name: str) -> dict[str, Any]:
    (node,) = [node for node in document["nodes"] if node["name"] == name]
    found: dict[str, Any] = node
    return found


def test_document_shape_and_cluster_totals(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_cluster(apiserver)
    document = _document(inspect)
    assert set(document) == {"kind", "version", "nodes", "cluster"}
    assert (document["kind"], document["version"]) == ("GpuInspection", 1)
    assert [node["name"] for node in document["nodes"]] == ["gpu-number-1", "gpu-share-1", "gpu-vgpu-1"]
    assert document["cluster"] == {
        "memoryMiB": {"allocated": 32768, "total": 114688, "percent": 28},
        "gpus": {"allocated": 7, "total": 8, "percent": 87},
        "npuMemoryMiB": {"allocated": 0, "total": 0, "percent": 0},
        "npus": {"allocated": 0, "total": 0, "percent": 0},
    }


def test_share_node(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_cluster(apiserver)
    node = _node(_document(inspect), "gpu-share-1")
    assert (node["address"], node["strategy"], node["memoryFactorMiB"]) == ("10.0.0.11", "share", 1)
    assert node["memoryMiB"] == {"allocated": 14336, "total": 32768}
    assert node["problems"] == []
    gpu0 = node["gpus"][0]
    assert gpu0["memoryMiB"] == {"allocated": 6144, "total": 16384}
    assert (gpu0["cores"], gpu0["podCount"], gpu0["podLimit"], gpu0["pendingCount"]) == (None, 2, None, 1)
    assert gpu0["pods"] == [
        {
            "namespace": "ml",
            "name": "train-a",
            "uid": gpu0["pods"][0]["uid"],
            "memoryMiB": 4096,
            "cores": None,
            "state": "assigned",
        },
        {
            "namespace": "ml",
            "name": "train-b",
            "uid": gpu0["pods"][1]["uid"],
            "memoryMiB": 2048,
            "cores": None,
            "state": "pending",
        },
    ]
    assert all(pod["uid"] for pod in gpu0["pods"])


def test_number_node(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_cluster(apiserver)
    node = _node(_document(inspect), "gpu-number-1")
    assert (node["strategy"], node["memoryMiB"]) == ("number", None)
    assert [gpu["healthy"] for gpu in node["gpus"]] == [True, True, True, False]
    assert [[pod["name"] for pod in gpu["pods"]] for gpu in node["gpus"]] == [
        ["batch-e"],
        ["batch-e"],
        ["batch-f"],
        [],
    ]
    assert node["gpus"][2]["pods"][0]["state"] == "pending"
    assert node["gpus"][0]["memoryMiB"] is None


def test_vgpu_node(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_cluster(apiserver)
    node = _node(_document(inspect), "gpu-vgpu-1")
    assert (node["strategy"], node["memoryFactorMiB"]) == ("vgpu", 2)
    gpu0, gpu1 = node["gpus"]
    assert (gpu0["uuid"], gpu0["model"], gpu0["healthy"]) == ("GPU-aaaa-0001", "NVIDIA-A100", True)
    assert gpu0["memoryMiB"] == {"allocated": 16384, "total": 40960}
    assert gpu0["cores"] == {"allocated": 60, "total": 100}
    assert (gpu0["podCount"], gpu0["podLimit"], gpu0["pendingCount"]) == (3, 10, 1)
    assert [(p["name"], p["memoryMiB"], p["cores"], p["state"]) for p in gpu0["pods"]] == [
        ("vg-g", 10240, 30, "assigned"),
        ("vg-h", 4096, 20, "pending"),
        ("vg-i", 2048, 10, "assigned"),
    ]
    assert gpu1["uuid"] == "GPU-bbbb-0002"
    assert [(p["name"], p["memoryMiB"]) for p in gpu1["pods"]] == [("vg-i", 2048)]


def test_node_argument(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_cluster(apiserver)
    document = _document(inspect, "gpu-vgpu-1")
    assert [node["name"] for node in document["nodes"]] == ["gpu-vgpu-1"]
    assert document["cluster"]["memoryMiB"] == {"allocated": 18432, "total": 81920, "percent": 22}


def test_named_node_without_gpus_is_shown_with_a_note(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_cluster(apiserver)
    (node,) = _document(inspect, "cpu-1")["nodes"]
    assert (node["strategy"], node["gpus"]) == ("none", [])
    assert "publishes no GPU resource" in node["problems"][0]
    # Every strategy's resource, the whole strategy's nvidia.com/gpu included.
    every = "volcano.sh/gpu-memory, volcano.sh/gpu-number, volcano.sh/vgpu-number, nvidia.com/gpu"
    assert f"GPU resource ({every})" in node["problems"][0]
