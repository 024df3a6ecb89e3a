"""The simulated scheduler's Events as a user reads them with the current kubectl (issue 19 item 5):
`Scheduled` for a bound pod, `FailedScheduling` with the filters' and extenders' reasons (and the
PodScheduled condition False) for one that stays Pending, a gang's reason for each of its pods;
and the gang's PodGroup as Volcano's CRD prints it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubesim.cluster import SimCluster
from kubesim.nodes import node
from kubesim.scratch import scratch_dir
from kubesim.workloads import Gang
from tests.sim.kubectl import Kubectl, cells, kubectl_for
from tests.sim.test_cluster_kubectl import section

NODE = "gpu-share-1"


def _pod(name: str, memory: str, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", **metadata},
        "spec": {
            "schedulerName": "volcano",
            "containers": [
                {"name": "cuda", "image": "cuda", "resources": {"limits": {"volcano.sh/gpu-memory": memory}}}
            ],
        },
    }


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    with scratch_dir("ev-") as directory:
        cluster = SimCluster(directory, [node(NODE, "share")])  # 2 GPUs of 10989 MiB
        try:
            cluster.start()
            cluster.schedule(cluster.submit(_pod("small", "2048")))
            cluster.schedule(cluster.submit(_pod("huge", "11000")))  # more than one GPU has
            gang = Gang("ml", "pair", 2, ("pair-0", "pair-1"), "PodGroup ml/pair")
            cluster.play([_pod("pair-0", "9000"), _pod("pair-1", "9000")], [gang])
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def kubectl(kubectl_binary: str, cluster: SimCluster, tmp_path: Path) -> Kubectl:
    return kubectl_for(kubectl_binary, cluster.kubeconfig, tmp_path)


def events_of(kubectl: Kubectl, pod: str) -> list[list[str]]:
    """`kubectl describe pod`'s Events rows: type, reason, age, from, message."""
    text = kubectl("describe", "pod", "-n", "ml", pod).stdout
    return cells("\n".join(section(text, "Events:")[1:]))[2:]  # after the header and its underline


def test_a_bound_pod_has_a_scheduled_event_from_its_scheduler(kubectl: Kubectl) -> None:
    ((kind, reason, _, source, message),) = events_of(kubectl, "small")
    assert (kind, reason, source) == ("Normal", "Scheduled", "volcano")
    assert message == f"Successfully assigned ml/small to {NODE}"


def test_a_pending_pod_says_why_in_failed_scheduling_and_its_condition(kubectl: Kubectl) -> None:
    ((kind, reason, _, source, message),) = events_of(kubectl, "huge")
    assert (kind, reason, source) == ("Warning", "FailedScheduling", "volcano")
    assert message.startswith(
        "0/1 nodes are available: 1 pod ml/huge needs 11000 MiB of GPU memory on one GPU"
    )
    text = kubectl("describe", "pod", "-n", "ml", "huge").stdout
    assert ["PodScheduled", "False"] in cells("\n".join(section(text, "Conditions:")[1:]))
    (row,) = cells(kubectl("get", "pod", "-n", "ml", "huge").stdout)[1:]
    assert row[2] == "Pending"


def test_every_pod_of_a_gang_that_cannot_start_says_so(kubectl: Kubectl) -> None:
    """Two of 9000 MiB: GPU 1 takes one, GPU 0 (2048 MiB used by `small`) neither."""
    for pod in ("pair-0", "pair-1"):
        ((kind, reason, _, _, message),) = events_of(kubectl, pod)
        assert (kind, reason) == ("Warning", "FailedScheduling")
        assert message.startswith(
            "gang not scheduled: pod group ml/pair (PodGroup ml/pair, minMember 2): 1 of 2 pods"
        )
    listed = cells(kubectl("get", "events", "-n", "ml", "--field-selector", "reason=FailedScheduling").stdout)
    assert sorted(row[3] for row in listed[1:]) == ["pod/huge", "pod/pair-0", "pod/pair-1"]


def test_the_gang_s_pod_group_is_there_for_kubectl(kubectl: Kubectl) -> None:
    rows = cells(kubectl("get", "podgroups", "-n", "ml", "-o", "wide").stdout)
    assert rows[0] == ["NAME", "STATUS", "MINMEMBER", "RUNNINGS", "AGE", "QUEUE"]
    (name, status, minimum, running, _, queue) = rows[1]
    assert (name, status, minimum, running, queue) == ("pair", "Pending", "2", "0", "default")
