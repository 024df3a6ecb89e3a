"""The daemon publishes its GPUs' interconnect as the node annotation `volcano.sh/gpu-topology`
(API-server emulator over HTTP, kubelet emulator over Unix sockets, the daemon as a subprocess):
only the GPUs it serves, for every strategy, and a stale value removed when it knows none."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from deviceplugin.fit.topology import TOPOLOGY_KEY, decode_topology
from deviceplugin.gpu.fake import FakeBackend, fake_uuid
from deviceplugin.gpu.topology import read_topology
from deviceplugin.plugin.devices import Layout
from deviceplugin.plugin.families import NODE_FAMILIES
from deviceplugin.plugin.family import NodeFamily
from deviceplugin.plugin.nodestate import with_topology
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import NODE, TIMEOUT_S, Daemon, eventually, state, streaming


def node_annotations(apiserver: ApiServerEmulator) -> dict[str, str]:
    node = apiserver.get("nodes", NODE)
    assert node is not None
    return dict(node["metadata"].get("annotations") or {})


def run_daemon(
    apiserver: ApiServerEmulator, start: Callable[..., Daemon], workdir: Path, *args: str
) -> Daemon:
    return start("--kubeconfig", str(apiserver.write_kubeconfig(workdir / "kubeconfig")), *args)


def test_a_vgpu_node_publishes_the_topology_of_the_gpus_it_serves(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """pcie-2socket with GPU 0 excluded: seven GPUs, GPU 1 no longer has its PCIe-switch partner."""
    apiserver.create("nodes", {"metadata": {"name": NODE}})
    daemon = run_daemon(
        apiserver,
        start,
        workdir,
        *("--fake-gpus", "8x1000", "--fake-gpu-topology", "pcie-2socket"),
        *("--gpu-strategy", "vgpu", "--exclude-gpus", "0"),
    )
    assert kubelet.wait_for(streaming("volcano.sh/vgpu-number"), TIMEOUT_S), daemon.output()
    eventually(lambda: TOPOLOGY_KEY in node_annotations(apiserver), daemon)
    published = decode_topology(node_annotations(apiserver)[TOPOLOGY_KEY])
    assert published.gpus == (1, 2, 3, 4, 5, 6, 7)
    assert published.numa == (0, 0, 0, 1, 1, 1, 1)
    assert [str(published.link(2, 3)), str(published.link(1, 2)), str(published.link(1, 4))] == [
        "PIX",
        "NODE",
        "SYS",
    ]


def test_listandwatch_hints_the_numa_nodes_the_annotation_publishes(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """nvlink-pairs puts GPUs 0-1 on NUMA node 0 and 2-3 on 1: kubelet's topology manager must see
    the same nodes the scheduler reads from volcano.sh/gpu-topology."""
    apiserver.create("nodes", {"metadata": {"name": NODE}})
    daemon = run_daemon(
        apiserver,
        start,
        workdir,
        *("--fake-gpus", "4x1000", "--fake-gpu-topology", "nvlink-pairs", "--gpu-strategy", "whole"),
    )
    assert kubelet.wait_for(streaming("nvidia.com/gpu"), TIMEOUT_S), daemon.output()
    eventually(lambda: TOPOLOGY_KEY in node_annotations(apiserver), daemon)
    published = decode_topology(node_annotations(apiserver)[TOPOLOGY_KEY])
    hinted = state(kubelet, "nvidia.com/gpu").topology
    assert dict(hinted) == {fake_uuid(gpu): (published.numa_of(gpu),) for gpu in published.gpus}
    assert published.numa == (0, 0, 1, 1)


def test_a_node_without_topology_removes_a_stale_one(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """Left by an earlier run with other GPUs: the scheduler must not choose cards by it."""
    stale = read_topology("nvlink-pairs").topology.encode()
    apiserver.create("nodes", {"metadata": {"name": NODE, "annotations": {TOPOLOGY_KEY: stale}}})
    daemon = run_daemon(apiserver, start, workdir, "--fake-gpus", "2x1000")
    assert kubelet.wait_for(streaming("volcano.sh/gpu-memory"), TIMEOUT_S), daemon.output()
    eventually(lambda: "volcano.sh/gpu-memory-factor" in node_annotations(apiserver), daemon)
    eventually(lambda: TOPOLOGY_KEY not in node_annotations(apiserver), daemon)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--fake-gpus", "4x1000", "--fake-gpu-topology", "dgx-a100"],
            "--fake-gpu-topology dgx-a100: describes 8 GPUs, the node has 4",
        ),
        (["--fake-gpus", "4x1000", "--fake-gpu-topology", "dgx-b200"], "--fake-gpu-topology: invalid value"),
        (["--fake-gpu-topology", "dgx-a100"], "--fake-gpu-topology needs --fake-gpus"),
    ],
)
def test_a_topology_that_does_not_fit_stops_the_start(workdir: Path, args: list[str], message: str) -> None:
    places = ["--device-plugin-dir", str(workdir / "plugins"), "--state-dir", str(workdir / "state")]
    done = subprocess.run(
        [sys.executable, "-m", "deviceplugin.cli", "run", "--node-name", "n", *places, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


@pytest.mark.parametrize("family", NODE_FAMILIES.values(), ids=lambda family: family.strategy)
def test_every_strategy_publishes_the_topology_beside_its_own_state(family: NodeFamily) -> None:
    """The daemon wraps each family's node state (daemon.KubeSide.build); no family drops it."""
    backend = FakeBackend.from_spec("4x1000", topology=read_topology("nvlink-pairs"))
    gpus = backend.inventory().gpus
    topology = backend.topology(gpus)
    own = family.node_state(gpus, {gpu.uuid: True for gpu in gpus}, Layout(1, 10))
    state = with_topology(own, topology)
    assert topology is not None and state.annotations[TOPOLOGY_KEY] == topology.encode()
    assert {k: v for k, v in state.annotations.items() if k != TOPOLOGY_KEY} == dict(own.annotations)
    assert (state.labels, state.resources) == (own.labels, own.resources)
    assert with_topology(own, None).annotations[TOPOLOGY_KEY] is None  # removed from the node
