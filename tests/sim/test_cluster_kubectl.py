"""What a user sees with the current kubectl on the simulated cluster (`deviceplugin simulate
--keep-running`): the API emulator, a GPU node (kubelet emulator and the real daemon with fake GPUs)
and the extender, with one GPU pod scheduled and admitted through them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubesim.cluster import Placement, SimCluster
from kubesim.nodes import node
from kubesim.scratch import scratch_dir
from tests.sim.apiserver_helpers import core_api
from tests.sim.kubectl import Kubectl, cells, kubectl_for

NODE = "gpu-share-1"
POD = "trainer"
NAMESPACE = "ml"


def _gpu_pod() -> dict[str, object]:
    resources = {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"memory": "1Gi", "volcano.sh/gpu-memory": "1024"},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": NAMESPACE},
        "spec": {"containers": [{"name": "cuda", "image": "nvidia/cuda", "resources": resources}]},
    }


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[SimCluster, Placement]]:
    with scratch_dir("kc-") as directory:  # Unix socket paths stay short
        cluster = SimCluster(directory, [node(NODE, "share")])
        try:
            cluster.start()
            placement = cluster.schedule(cluster.submit(_gpu_pod()))
            cluster.settle([placement])
            assert not placement.problem, placement.problem
            yield cluster, placement
        finally:
            cluster.stop()


@pytest.fixture
def kubectl(kubectl_binary: str, cluster: tuple[SimCluster, Placement], tmp_path: Path) -> Kubectl:
    return kubectl_for(kubectl_binary, cluster[0].kubeconfig, tmp_path)


def section(output: str, title: str) -> list[str]:
    """The lines of one `kubectl describe` section, its title line first."""
    lines = output.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(title))
    end = next(
        (index for index in range(start + 1, len(lines)) if lines[index][:1] not in (" ", "")),
        len(lines),
    )
    return lines[start:end]


def test_get_nodes_shows_the_node_ready_with_its_kubelet_and_os(kubectl: Kubectl) -> None:
    rows = cells(kubectl("get", "nodes", "-o", "wide").stdout)
    assert rows[0][:5] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    name, status, roles, _, version, internal_ip, external_ip, os_image, kernel, runtime = rows[1]
    assert (name, status, roles, version) == (NODE, "Ready", "<none>", "v1.32.0+kubesim")
    assert (internal_ip, external_ip) == ("127.0.0.1", "<none>")
    assert "<unknown>" not in (os_image, kernel) and runtime.startswith("sim://")


def test_describe_node_shows_conditions_capacity_and_allocated_percentages(kubectl: Kubectl) -> None:
    text = kubectl("describe", "node", NODE).stdout
    conditions = cells("\n".join(section(text, "Conditions:")[1:]))
    ready = next(row for row in conditions if row[0] == "Ready")
    assert (ready[1], ready[4], ready[5]) == ("True", "KubeletReady", "kubelet is posting ready status")
    assert [row[:2] for row in conditions[2:]] == [
        ["MemoryPressure", "False"],
        ["DiskPressure", "False"],
        ["PIDPressure", "False"],
        ["Ready", "True"],
    ]
    allocatable = dict(cells("\n".join(section(text, "Allocatable:")[1:])))
    assert allocatable["cpu:"] == "8" and allocatable["memory:"] == "32Gi"
    assert allocatable["volcano.sh/gpu-memory:"] == "21978" and allocatable["volcano.sh/gpu-number:"] == "2"
    assert "InternalIP:  127.0.0.1" in text and f"Hostname:    {NODE}" in text
    assert f"HolderIdentity:  {NODE}" in text and "Failed to get lease" not in text
    # kubectl sums the node's non-terminated pods' requests against allocatable (500m of 8 CPUs).
    pods = cells("\n".join(section(text, "Non-terminated Pods:")[1:]))
    assert pods[0][:6] == [
        "Namespace",
        "Name",
        "CPU Requests",
        "CPU Limits",
        "Memory Requests",
        "Memory Limits",
    ]
    assert pods[2][:6] == [NAMESPACE, POD, "500m (6%)", "0 (0%)", "1Gi (3%)", "1Gi (3%)"]
    allocated = {row[0]: row[1:] for row in cells("\n".join(section(text, "Allocated resources:")[2:]))}
    assert allocated["cpu"] == ["500m (6%)", "0 (0%)"] and allocated["memory"] == ["1Gi (3%)", "1Gi (3%)"]
    assert allocated["volcano.sh/gpu-memory"] == ["1024", "1024"]
    assert "-9223372036854775808" not in text
    events = cells("\n".join(section(text, "Events:")[1:]))
    assert ["Normal", "NodeReady"] in [row[:2] for row in events]


def test_get_pods_shows_the_running_pod_ready_with_its_restarts_and_ip(kubectl: Kubectl) -> None:
    rows = cells(kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide").stdout)
    assert rows[0][:7] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]
    name, ready, status, restarts, _, ip, node = rows[1][:7]
    assert (name, ready, status, restarts, node) == (POD, "1/1", "Running", "0", NODE)
    assert ip.startswith("10.")


def test_describe_pod_shows_its_conditions_and_container_state(kubectl: Kubectl) -> None:
    text = kubectl("describe", "pod", "-n", NAMESPACE, POD).stdout
    conditions = dict(cells("\n".join(section(text, "Conditions:")[2:])))
    assert conditions == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
        "PodScheduled": "True",
    }
    assert f"Node:         {NODE}/127.0.0.1" in text
    container = "\n".join(section(text, "Containers:"))
    assert "State:          Running" in container and "Ready:          True" in container
    assert "Restart Count:  0" in container


def test_get_events_and_events_list_the_nodes_events(kubectl: Kubectl) -> None:
    message = f"Node {NODE} status is now: NodeReady"
    rows = cells(kubectl("get", "events", "-A").stdout)
    assert rows[0] == ["NAMESPACE", "LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert ["default", "Normal", "NodeReady", f"node/{NODE}", message] in [
        [row[0], *row[2:]] for row in rows[1:]
    ]
    assert re.fullmatch(r"\d+s", rows[1][1])
    rows = cells(kubectl("events", "--for", f"node/{NODE}").stdout)
    assert rows[0] == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert [row[1:] for row in rows[1:]] == [["Normal", "NodeReady", f"Node/{NODE}", message]]


def test_the_official_client_reads_them_as_its_models(cluster: tuple[SimCluster, Placement]) -> None:
    api = core_api(cluster[0].kubeconfig)
    try:
        node = api.read_node(NODE)
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert (ready.status, ready.reason) == ("True", "KubeletReady")
        assert (
            node.status.allocatable["cpu"] == "8"
            and node.status.daemon_endpoints.kubelet_endpoint.port == 10250
        )
        pod = api.read_namespaced_pod(POD, NAMESPACE)
        (container,) = pod.status.container_statuses
        assert (container.ready, container.started, container.restart_count) == (True, True, 0)
        assert container.state.running.started_at is not None and pod.status.start_time is not None
    finally:
        api.api_client.close()
