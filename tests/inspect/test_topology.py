"""`inspect` shows the GPU interconnect a node publishes (`volcano.sh/gpu-topology`): a matrix like
`nvidia-smi topo -m` with `-d`, the pairs in `-o json`; a malformed one is a problem note."""

from __future__ import annotations

import json

from deviceplugin.fit import keys
from deviceplugin.fit.topology import TOPOLOGY_KEY
from deviceplugin.gpu.topology import read_topology
from kubesim.apiserver import ApiServerEmulator
from tests.inspect.cluster import gpu_node, load_share
from tests.inspect.conftest import Inspect
from tests.inspect.table import gpu_row


def load_linked(server: ApiServerEmulator, topology: str) -> None:
    """gpu-number-2: 4 GPUs, bridged in pairs 0-1 and 2-3, as its daemon publishes them."""
    notes = {TOPOLOGY_KEY: topology}
    server.create("nodes", gpu_node("gpu-number-2", "10.0.0.40", {keys.GPU_NUMBER: "4"}, notes))


def test_details_draw_the_matrix_with_numa_nodes(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_linked(apiserver, read_topology("nvlink-pairs").topology.encode())
    run = inspect("-d")
    assert run.code == 0, run.err
    section = run.out.split("gpu-number-2 (number):")[1]
    lines = section.split("GPU topology:")[1].splitlines()[1:6]
    assert [line.split() for line in lines] == [
        ["GPU0", "GPU1", "GPU2", "GPU3", "NUMA"],
        ["GPU0", "X", "NV4", "SYS", "SYS", "0"],
        ["GPU1", "NV4", "X", "SYS", "SYS", "0"],
        ["GPU2", "SYS", "SYS", "X", "NV4", "1"],
        ["GPU3", "SYS", "SYS", "NV4", "X", "1"],
    ]
    assert "NV<n>: n NVLinks" in section


def test_an_unknown_numa_node_and_served_indices_are_shown(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    """GPU 0 excluded: the matrix names the GPUs the node serves, by their indices."""
    load_linked(apiserver, '{"gpus":[1,2,3],"numa":[0,-1,1],"links":["PIX","SYS","NV2"]}')
    run = inspect("-d")
    lines = run.out.split("GPU topology:")[1].splitlines()[1:5]
    assert [line.split() for line in lines] == [
        ["GPU1", "GPU2", "GPU3", "NUMA"],
        ["GPU1", "X", "PIX", "SYS", "0"],
        ["GPU2", "PIX", "X", "NV2", "-"],
        ["GPU3", "SYS", "NV2", "X", "1"],
    ]


def test_json_carries_the_topology_or_null(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_share(apiserver)
    load_linked(apiserver, read_topology("nvlink-pairs").topology.encode())
    run = inspect("-o", "json")
    assert run.code == 0, run.err
    nodes = {node["name"]: node for node in json.loads(run.out)["nodes"]}
    assert nodes["gpu-number-2"]["topology"] == {
        "gpus": [0, 1, 2, 3],
        "numa": [0, 0, 1, 1],
        "links": {"0-1": "NV4", "0-2": "SYS", "0-3": "SYS", "1-2": "SYS", "1-3": "SYS", "2-3": "NV4"},
    }
    assert nodes["gpu-share-1"]["topology"] is None


def test_a_malformed_topology_is_a_note_and_the_node_is_still_shown(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    load_linked(apiserver, '{"gpus":[0,0],"numa":[0,0],"links":["NV4"]}')
    run = inspect("-d")
    assert run.code == 0, run.err
    assert gpu_row(run.out, "gpu-number-2", "3")["HEALTH"] == "ok"
    problems = run.out.split("Problems:")[1]
    assert f"gpu-number-2: node annotation {TOPOLOGY_KEY}: GPU indices repeat: [0, 0]" in problems
    assert "GPU topology:" not in run.out
    document = json.loads(inspect("-o", "json").out)
    (node,) = document["nodes"]
    assert node["topology"] is None
    assert any("GPU indices repeat" in problem for problem in node["problems"])
