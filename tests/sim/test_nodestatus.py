"""Node status from the kubelet emulation: a kubelet emulator with a device plugin on real sockets,
its node status reporter writing over HTTP to the API emulator, read back with the client and kubectl."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from deviceplugin.api import UNHEALTHY
from deviceplugin.kube.api import Kube, load_client
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from kubesim.nodestatus import NodeStatusReporter
from kubesim.scratch import scratch_dir
from tests.sim.apiserver_helpers import Obj, running_emulator, wait_until
from tests.sim.kubectl import Kubectl, cells, kubectl_for
from tests.sim.test_kubelet import RESOURCE, PluginServer, device, register

NODE = "gpu-1"
QUIET_S = 3600.0  # a heartbeat that never comes within a test: every write seen is change-driven


class Node:
    """The API emulator with NODE registered, its kubelet emulator and node status reporter."""

    def __init__(
        self, emulator: ApiServerEmulator, directory: Path, heartbeat_s: float, clock: Callable[[], float]
    ):
        self.emulator = emulator
        emulator.create("nodes", {"metadata": {"name": NODE}})
        kube = Kube(load_client(emulator.write_kubeconfig(directory / "kubeconfig")))
        self.reporter = NodeStatusReporter(NODE, kube, heartbeat_s=heartbeat_s, clock=clock)
        self.kubelet = KubeletEmulator(directory / "plugins", listener=self.reporter.kubelet_event)
        self.kubelet.start()
        self.reporter.start()

    def stop(self) -> None:
        self.kubelet.stop()
        self.reporter.stop()

    def status(self) -> Obj:
        return (self.emulator.get("nodes", NODE) or {}).get("status") or {}

    def ready(self) -> Obj:
        return ready_of(self.status())

    def shows(self, predicate: Callable[[Obj], bool]) -> bool:
        return wait_until(lambda: predicate(self.status()))


def ready_of(status: Obj) -> Obj:
    """The Ready condition, {} before there is one."""
    return next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})


@pytest.fixture
def directory() -> Iterator[Path]:
    with scratch_dir("ns-") as path:  # Unix socket paths stay short
        yield path


@pytest.fixture
def emulator() -> Iterator[ApiServerEmulator]:
    with running_emulator() as emulator:
        yield emulator


@contextmanager
def running_node(
    emulator: ApiServerEmulator, directory: Path, heartbeat_s: float, clock: Callable[[], float]
) -> Iterator[Node]:
    node = Node(emulator, directory, heartbeat_s, clock)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def node(emulator: ApiServerEmulator, directory: Path) -> Iterator[Node]:
    with running_node(emulator, directory, QUIET_S, lambda: 1_700_000_000.0) as running:
        yield running


@pytest.fixture
def kubectl(kubectl_binary: str, emulator: ApiServerEmulator, tmp_path: Path) -> Kubectl:
    return kubectl_for(kubectl_binary, emulator.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path)


def test_the_node_is_ready_and_shows_what_kubelet_holds(node: Node, kubectl: Kubectl) -> None:
    plugin = PluginServer(node.kubelet.directory)
    plugin.start()
    try:
        plugin.servicer.publish([device("gpu-0"), device("gpu-1", UNHEALTHY)])
        register(node.kubelet.directory)
        assert node.shows(
            lambda s: (s["capacity"].get(RESOURCE), s["allocatable"].get(RESOURCE)) == ("2", "1")
        )
        plugin.servicer.publish([device("gpu-0"), device("gpu-1")])  # written on the change, not a heartbeat
        assert node.shows(lambda s: s["allocatable"][RESOURCE] == "2")
    finally:
        plugin.stop()
    status = node.status()
    assert {k: status["allocatable"][k] for k in ("cpu", "memory", "ephemeral-storage", "pods")} == {
        "cpu": "8",
        "memory": "32Gi",
        "ephemeral-storage": "100Gi",
        "pods": "110",
    }
    name, ready, roles, _, version = cells(kubectl("get", "node", NODE).stdout)[1]
    assert (name, ready, roles, version) == (NODE, "Ready", "<none>", "v1.32.0+kubesim")


def test_heartbeats_renew_while_the_transition_time_stays(
    emulator: ApiServerEmulator, directory: Path
) -> None:
    seconds = itertools.count(1_700_000_000, 60)  # each write a minute after the one before
    with running_node(emulator, directory, 0.01, lambda: float(next(seconds))) as node:
        assert node.shows(lambda s: bool(ready_of(s)))
        first = node.ready()
        assert first["status"] == "True" and first["lastHeartbeatTime"] == first["lastTransitionTime"]
        assert node.shows(lambda s: ready_of(s)["lastHeartbeatTime"] > first["lastHeartbeatTime"])
        assert node.ready()["lastTransitionTime"] == first["lastTransitionTime"]


def test_the_node_lease_is_renewed_with_each_heartbeat(
    emulator: ApiServerEmulator, directory: Path, kubectl: Kubectl
) -> None:
    seconds = itertools.count(1_700_049_600, 60)  # from 2023-11-15 12:00 UTC
    with running_node(emulator, directory, 0.01, lambda: float(next(seconds))):
        assert wait_until(lambda: emulator.get("leases", NODE, "kube-node-lease") is not None)
        first = (emulator.get("leases", NODE, "kube-node-lease") or {})["spec"]
        assert wait_until(
            lambda: (
                (emulator.get("leases", NODE, "kube-node-lease") or {})["spec"]["renewTime"]
                > first["renewTime"]
            )
        )
        lease = emulator.get("leases", NODE, "kube-node-lease") or {}
        node_uid = (emulator.get("nodes", NODE) or {})["metadata"]["uid"]
    assert (lease["spec"]["holderIdentity"], lease["spec"]["leaseDurationSeconds"]) == (NODE, 40)
    assert lease["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid}
    ]
    assert cells(kubectl("get", "leases", "-n", "kube-node-lease").stdout)[1][:2] == [NODE, NODE]
    described = kubectl("describe", "node", NODE).stdout
    assert "Failed to get lease" not in described
    assert f"HolderIdentity:  {NODE}" in described and "RenewTime:       Wed, 15 Nov 2023 12:" in described


def test_a_stopped_kubelet_leaves_the_node_not_ready_until_it_serves_again(
    node: Node, kubectl: Kubectl
) -> None:
    assert node.shows(lambda s: ready_of(s).get("status") == "True")
    heartbeat = node.ready()["lastHeartbeatTime"]
    node.kubelet.stop()
    assert node.shows(lambda s: ready_of(s).get("status") == "Unknown")
    assert cells(kubectl("get", "nodes").stdout)[1][:2] == [NODE, "NotReady"]
    conditions = node.status()["conditions"]
    assert {(c["type"], c["status"], c["reason"], c["message"]) for c in conditions} == {
        (kind, "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
    }
    assert {c["lastHeartbeatTime"] for c in conditions} == {heartbeat}  # nobody posted after the stop
    described = kubectl("describe", "node", NODE).stdout
    assert "Ready            Unknown" in described and "Kubelet stopped posting node status." in described

    node.kubelet.start()
    assert node.shows(lambda s: ready_of(s).get("status") == "True")
    # The Event follows the status write that made the node Ready: wait for it, not for the status.
    expected = ["NodeNotReady"] + ["NodeReady"] * 2
    posted = node.emulator.list
    assert wait_until(lambda: sorted(e["reason"] for e in posted("events", "default")) == expected)
    events = cells(kubectl("get", "events").stdout)
    assert events[0] == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert sorted(row[2] for row in events[1:]) == expected
    assert {(row[3], row[4]) for row in events[1:]} == {
        (f"node/{NODE}", f"Node {NODE} status is now: NodeReady"),
        (f"node/{NODE}", f"Node {NODE} status is now: NodeNotReady"),
    }


def test_a_failed_write_is_tried_again(emulator: ApiServerEmulator, directory: Path) -> None:
    emulator.faults.error(503, method="PATCH", path=f"/api/v1/nodes/{NODE}/status", times=2)
    with running_node(emulator, directory, 0.01, lambda: 1_700_000_000.0) as node:
        assert node.shows(lambda s: ready_of(s).get("status") == "True")
    assert emulator.requests.count(method="PATCH", path="/status") >= 3
