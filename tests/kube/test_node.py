"""Node annotations and status published through the API-server emulator over HTTP: written only
on change, and restored when someone else changes or removes them (node watch, periodic read,
kubelet re-registration)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from deviceplugin.fit.keys import Strategy
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.health import HealthState
from deviceplugin.kube.api import Kube
from deviceplugin.kube.node import NodePublisher, NodeState, NodeWatch
from deviceplugin.plugin.devices import Layout
from deviceplugin.plugin.families import node_family_of
from kubesim.apiserver import ApiServerEmulator
from tests.kube.objects import node_object
from tests.kube.waiting import WAIT_S, wait_for

GPUS = tuple(GpuInfo(index=i, uuid=f"GPU-{i}", model="Fake GPU", memory_mib=10989) for i in range(3))
NODE_PATH = "/api/v1/nodes/node-a"
NODE_LIST = "fieldSelector=metadata.name"  # the watch's list and watch requests, not the reads


@pytest.fixture
def health() -> HealthState:
    return HealthState(tuple(g.uuid for g in GPUS))


Start = Callable[..., NodePublisher]


@pytest.fixture
def start(apiserver: ApiServerEmulator, kube: Kube, health: HealthState) -> Iterator[Start]:
    """Start a node watch and a publisher on node-a (created unless the test did)."""
    running: list[tuple[NodeWatch, NodePublisher]] = []

    def launch(strategy: Strategy = "share", resync_s: float = 600.0) -> NodePublisher:
        if apiserver.get("nodes", "node-a") is None:
            apiserver.create("nodes", node_object("node-a"))
        watch = NodeWatch(kube, "node-a")
        publisher = NodePublisher(
            kube,
            watch,
            lambda: node_family_of(strategy).node_state(GPUS, health.snapshot()[1], Layout(4)),
            health,
            resync_s,
        )
        publisher.start()
        watch.start()
        running.append((watch, publisher))
        assert wait_for(lambda: publisher.published)
        return publisher

    yield launch
    apiserver.faults.clear()
    for watch, publisher in running:
        watch.stop()
        publisher.stop()


def node(apiserver: ApiServerEmulator) -> dict[str, Any]:
    found = apiserver.get("nodes", "node-a")
    assert found is not None
    return found


def node_annotations(apiserver: ApiServerEmulator) -> dict[str, str]:
    return dict(node(apiserver)["metadata"].get("annotations") or {})


def writes(apiserver: ApiServerEmulator) -> int:
    """Patches of node-a, its status included."""
    return apiserver.requests.count(method="PATCH", path=NODE_PATH)


def settle(publisher: NodePublisher) -> None:
    """Let the publisher compare once more against a fresh read of the node."""
    done = publisher.checks
    publisher.recheck()
    assert publisher.wait_checks(done + 1, WAIT_S)


def test_share_mode_publishes_gpu_number_and_factor(apiserver: ApiServerEmulator, start: Start) -> None:
    start("share")
    status = node(apiserver)["status"]
    assert status["capacity"]["volcano.sh/gpu-number"] == "3"
    assert status["allocatable"]["volcano.sh/gpu-number"] == "3"
    assert status["capacity"]["cpu"] == "8"  # untouched
    assert node_annotations(apiserver) == {"volcano.sh/gpu-memory-factor": "4"}


def test_unchanged_state_is_never_rewritten(apiserver: ApiServerEmulator, start: Start) -> None:
    publisher = start("share", resync_s=0.05)
    assert writes(apiserver) == 2  # annotations + status, once
    done = publisher.checks
    reads = apiserver.requests.count(method="GET", path=NODE_PATH)
    apiserver.patch("nodes", "node-a", {"metadata": {"labels": {"team": "ml"}}})  # someone else's key
    assert publisher.wait_checks(done + 10, WAIT_S)  # watch events and periodic reads
    assert apiserver.requests.count(method="GET", path=NODE_PATH) > reads
    assert writes(apiserver) == 2


def test_health_change_follows(apiserver: ApiServerEmulator, start: Start, health: HealthState) -> None:
    start("share")
    health.set(("GPU-1",), healthy=False, reason="Xid 79")
    assert wait_for(lambda: node_annotations(apiserver).get("volcano.sh/gpu-unhealthy-ids") == "1")
    health.set(("GPU-2",), healthy=False, reason="Xid 79")
    assert wait_for(lambda: node_annotations(apiserver).get("volcano.sh/gpu-unhealthy-ids") == "1,2")
    health.set(("GPU-1", "GPU-2"), healthy=True, reason="recovered")
    assert wait_for(lambda: "volcano.sh/gpu-unhealthy-ids" not in node_annotations(apiserver))


@pytest.mark.parametrize(
    ("strategy", "patch", "subresource"),
    [
        ("share", {"metadata": {"annotations": {"volcano.sh/gpu-unhealthy-ids": "0,2"}}}, ""),
        ("share", {"metadata": {"annotations": {"volcano.sh/gpu-memory-factor": None}}}, ""),
        ("share", {"status": {"capacity": {"volcano.sh/gpu-number": "0"}}}, "status"),
        ("share", {"status": {"allocatable": {"volcano.sh/gpu-number": None}}}, "status"),
        ("number", {"metadata": {"annotations": {"volcano.sh/gpu-unhealthy-ids": "1"}}}, ""),
        ("vgpu", {"metadata": {"annotations": {"volcano.sh/node-vgpu-register": None}}}, ""),
        (
            "vgpu",
            {"metadata": {"annotations": {"volcano.sh/node-vgpu-register": "GPU-0,1,1,x,true,mig:"}}},
            "",
        ),
    ],
    ids=[
        "unhealthy-ids-edited",
        "memory-factor-removed",
        "gpu-number-capacity-reset",
        "gpu-number-allocatable-removed",
        "number-unhealthy-ids-added",
        "vgpu-register-removed",
        "vgpu-register-edited",
    ],
)
def test_foreign_change_is_restored_by_the_watch_in_one_write(
    apiserver: ApiServerEmulator, start: Start, strategy: Strategy, patch: dict[str, Any], subresource: str
) -> None:
    publisher = start(strategy)  # no periodic read within the test: only the watch can see it
    wanted = node(apiserver)
    before = writes(apiserver)
    apiserver.patch("nodes", "node-a", patch, subresource=subresource)

    def restored() -> bool:
        now = node(apiserver)
        return now["metadata"].get("annotations") == wanted["metadata"].get("annotations") and all(
            now["status"][section].get("volcano.sh/gpu-number")
            == wanted["status"][section].get("volcano.sh/gpu-number")
            for section in ("capacity", "allocatable")
        )

    assert wait_for(restored)
    settle(publisher)
    assert writes(apiserver) == before + 1


def test_periodic_read_restores_while_the_watch_is_down(apiserver: ApiServerEmulator, start: Start) -> None:
    publisher = start("share", resync_s=0.1)
    apiserver.faults.error(503, path=NODE_LIST)  # the watch can neither list nor watch again
    apiserver.drop_watches()
    assert wait_for(lambda: not publisher.watch.synced)
    reset = {"status": {"capacity": {"volcano.sh/gpu-number": "0"}}}
    apiserver.patch("nodes", "node-a", reset, subresource="status")
    assert wait_for(lambda: node(apiserver)["status"]["capacity"]["volcano.sh/gpu-number"] == "3")


def test_recheck_reads_the_node_at_once(apiserver: ApiServerEmulator, start: Start) -> None:
    """What kubelet re-registration triggers: with no watch and no periodic read due, the node is
    read and repaired right away."""
    publisher = start("share")
    apiserver.faults.error(503, path=NODE_LIST)
    apiserver.drop_watches()
    assert wait_for(lambda: not publisher.watch.synced)
    apiserver.patch("nodes", "node-a", {"metadata": {"annotations": {"volcano.sh/gpu-memory-factor": "1"}}})
    settle(publisher)
    assert node_annotations(apiserver)["volcano.sh/gpu-memory-factor"] == "4"


def test_survives_conflicts_and_outages(
    apiserver: ApiServerEmulator, start: Start, health: HealthState
) -> None:
    publisher = start("share")
    apiserver.faults.error(409, method="PATCH", times=2)
    health.set(("GPU-0",), healthy=False, reason="Xid 79")
    assert wait_for(lambda: node_annotations(apiserver).get("volcano.sh/gpu-unhealthy-ids") == "0")
    apiserver.faults.error(503)
    done = publisher.checks
    health.set(("GPU-0",), healthy=True, reason="recovered")
    assert publisher.wait_checks(done + 2, WAIT_S)  # tried, failed, tried again
    assert node_annotations(apiserver).get("volcano.sh/gpu-unhealthy-ids") == "0"  # not reachable yet
    apiserver.faults.clear()
    assert wait_for(lambda: "volcano.sh/gpu-unhealthy-ids" not in node_annotations(apiserver))


def test_existing_values_are_not_rewritten(apiserver: ApiServerEmulator, start: Start) -> None:
    ready = node_object("node-a")
    ready["metadata"]["annotations"] = {"volcano.sh/gpu-memory-factor": "4"}
    ready["metadata"]["labels"] = {"volcano.sh/gpu-strategy": "share"}
    apiserver.create("nodes", ready)
    resources = {"volcano.sh/gpu-number": "3"}
    apiserver.patch(
        "nodes", "node-a", {"status": {"capacity": resources, "allocatable": resources}}, subresource="status"
    )
    settle(start("share"))
    assert apiserver.requests.count(method="PATCH") == 0


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (
            "share",
            NodeState(
                {"volcano.sh/gpu-unhealthy-ids": "2", "volcano.sh/gpu-memory-factor": "4"},
                {"volcano.sh/gpu-number": "3"},
                {"volcano.sh/gpu-strategy": "share"},
            ),
        ),
        (
            "number",
            NodeState({"volcano.sh/gpu-unhealthy-ids": "2"}, {}, {"volcano.sh/gpu-strategy": "number"}),
        ),
        (
            "vgpu",
            NodeState(
                {
                    "volcano.sh/node-vgpu-register": "GPU-0,10,2747,NVIDIA-Fake GPU,true,hami-core:"
                    "GPU-1,10,2747,NVIDIA-Fake GPU,true,hami-core:"
                    "GPU-2,10,2747,NVIDIA-Fake GPU,false,hami-core:",
                    "volcano.sh/gpu-memory-factor": "4",
                },
                {},
                {"volcano.sh/gpu-strategy": "vgpu"},
            ),
        ),
    ],
)
def test_wanted_state_per_strategy(strategy: Strategy, expected: NodeState) -> None:
    health = {"GPU-0": True, "GPU-1": True, "GPU-2": False}
    assert node_family_of(strategy).node_state(GPUS, health, Layout(4)) == expected
