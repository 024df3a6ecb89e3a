"""A simulated node's `topology:` (a preset of the daemon's): parsed and checked with the node's
other fields, and published by its daemon as `volcano.sh/gpu-topology`."""

from __future__ import annotations

import pytest

from deviceplugin.fit.topology import TOPOLOGY_KEY, decode_topology
from deviceplugin.gpu.topology import read_topology
from kubesim.cluster import SimCluster
from kubesim.nodes import NodeSpecError, parse_node_options, parse_nodes
from kubesim.scratch import scratch_dir
from tests.kube.waiting import wait_for


def test_a_preset_gives_the_node_its_gpu_count_and_the_daemon_its_option() -> None:
    (spec,) = parse_nodes([{"name": "dgx-1", "strategy": "number", "topology": "dgx-a100"}], "scenario")
    assert (spec.count, spec.topology) == (8, "dgx-a100")
    options = spec.daemon_options(mps_root=None)  # type: ignore[arg-type]  # not an mps node
    assert options == ["--fake-gpu-topology", "dgx-a100"]


def test_a_vgpu_node_gets_both_its_mode_and_topology() -> None:
    (spec,) = parse_node_options(["strategy=vgpu,topology=nvlink-pairs,memory-factor=4"])
    assert spec.count == 4
    assert spec.daemon_options(mps_root=None) == [  # type: ignore[arg-type]
        "--fake-gpu-topology",
        "nvlink-pairs",
        "--vgpu-mode",
        "hami-core",
    ]


def test_a_node_without_topology_passes_none() -> None:
    (spec,) = parse_nodes([{"strategy": "share"}], "scenario")
    assert spec.topology is None
    assert spec.daemon_options(mps_root=None) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"strategy": "number", "topology": "dgx-h100"},
            "scenario: nodes[0].topology: 'dgx-h100' must be one of dgx-a100, pcie-2socket, nvlink-pairs",
        ),
        ({"strategy": "number", "topology": 8}, "scenario: nodes[0].topology: 8 must be one of"),
        (
            {"strategy": "number", "topology": "pcie-2socket", "count": 4},
            "scenario: nodes[0].topology: pcie-2socket describes 8 GPUs; the node has count 4 "
            "(leave count out, or give 8)",
        ),
    ],
)
def test_a_topology_that_cannot_be_simulated_is_refused(entry: dict[str, object], message: str) -> None:
    with pytest.raises(NodeSpecError) as caught:
        parse_nodes([entry], "scenario")
    assert str(caught.value).startswith(message)


def test_the_simulated_node_publishes_its_preset() -> None:
    (spec,) = parse_nodes([{"name": "gpu-linked-1", "strategy": "number", "topology": "nvlink-pairs"}], "t")
    with scratch_dir("topo-") as directory:
        cluster = SimCluster(directory, [spec])
        try:
            cluster.start()

            def published() -> str | None:
                node = cluster.apiserver.get("nodes", spec.name) or {}
                value = (node.get("metadata", {}).get("annotations") or {}).get(TOPOLOGY_KEY)
                return None if value is None else str(value)

            assert wait_for(lambda: published() is not None, 60), cluster.nodes[spec.name].output()
            assert decode_topology(published() or "") == read_topology("nvlink-pairs").topology
        finally:
            cluster.stop()
