"""Node annotations and status published through the API-server emulator, only on change."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from deviceplugin.fit.keys import Strategy
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.health import HealthState
from deviceplugin.kube.api import Kube
from deviceplugin.kube.node import NodePublisher, NodeState
from deviceplugin.plugin.devices import Layout
from deviceplugin.plugin.nodestate import wanted_node_state
from deviceplugin.sim.apiserver import ApiServerEmulator
from tests.kube.objects import node_object

WAIT_S = 5.0
GPUS = tuple(GpuInfo(index=i, uuid=f"GPU-{i}", model="Fake GPU", memory_mib=10989) for i in range(3))


def wait_for(check: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def health() -> HealthState:
    return HealthState(tuple(g.uuid for g in GPUS))


def start(kube: Kube, health: HealthState, strategy: Strategy, factor: int = 1) -> NodePublisher:
    publisher = NodePublisher(
        kube,
        "node-a",
        lambda: wanted_node_state(strategy, GPUS, health.snapshot()[1], Layout(factor)),
        health,
    )
    publisher.start()
    return publisher


@pytest.fixture
def share(apiserver: ApiServerEmulator, kube: Kube, health: HealthState) -> Iterator[NodePublisher]:
    apiserver.create("nodes", node_object("node-a"))
    publisher = start(kube, health, "share", factor=4)
    yield publisher
    publisher.stop()


def node_annotations(apiserver: ApiServerEmulator) -> dict[str, str]:
    node = apiserver.get("nodes", "node-a")
    assert node is not None
    return dict(node["metadata"].get("annotations") or {})


def test_share_mode_publishes_gpu_number_and_factor(
    apiserver: ApiServerEmulator, share: NodePublisher
) -> None:
    assert wait_for(lambda: share.published)
    node = apiserver.get("nodes", "node-a")
    assert node is not None
    assert node["status"]["capacity"]["volcano.sh/gpu-number"] == "3"
    assert node["status"]["allocatable"]["volcano.sh/gpu-number"] == "3"
    assert node["status"]["capacity"]["cpu"] == "8"  # untouched
    assert node_annotations(apiserver) == {"volcano.sh/gpu-memory-factor": "4"}


def test_unchanged_state_is_written_once(
    apiserver: ApiServerEmulator, share: NodePublisher, health: HealthState
) -> None:
    assert wait_for(lambda: share.published)
    patches = apiserver.requests.count(method="PATCH")
    assert patches == 2  # annotations + status, once
    for _ in range(20):
        health.wake()  # loop the publisher without a change
        time.sleep(0.02)
    time.sleep(1.5)  # and let it idle through its periodic re-check
    assert apiserver.requests.count(method="PATCH") == patches


def test_health_change_follows_within_a_second(
    apiserver: ApiServerEmulator, share: NodePublisher, health: HealthState
) -> None:
    assert wait_for(lambda: share.published)
    health.set(("GPU-1",), healthy=False, reason="Xid 79")
    started = time.monotonic()
    assert wait_for(lambda: node_annotations(apiserver).get("volcano.sh/gpu-unhealthy-ids") == "1")
    assert time.monotonic() - started < WAIT_S
    health.set(("GPU-2",), healthy=False, reason="Xid 79")
    assert wait_for(lambda: node_annotations(apiserver).get("volcano.sh/gpu-unhealthy-ids") == "1,2")
    health.set(("GPU-1", "GPU-2"), healthy=True, reason="recovered")
    assert wait_for(lambda: "volcano.sh/gpu-unhealthy-ids" not in node_annotations(apiserver))


def test_survives_conflicts_and_outages(
    apiserver: ApiServerEmulator, share: NodePublisher, health: HealthState
) -> None:
    assert wait_for(lambda: share.published)
    apiserver.faults.error(409, method="PATCH", times=2)
    health.set(("GPU-0",), healthy=False, reason="Xid 79")
    assert wait_for(lambda: node_annotations(apiserver).get("volcano.sh/gpu-unhealthy-ids") == "0")
    apiserver.faults.error(503)
    health.set(("GPU-0",), healthy=True, reason="recovered")
    time.sleep(0.5)
    assert node_annotations(apiserver).get("volcano.sh/gpu-unhealthy-ids") == "0"  # not reachable yet
    apiserver.faults.clear()
    assert wait_for(lambda: "volcano.sh/gpu-unhealthy-ids" not in node_annotations(apiserver), 15)


def test_existing_values_are_not_rewritten(
    apiserver: ApiServerEmulator, kube: Kube, health: HealthState
) -> None:
    node = node_object("node-a")
    node["metadata"]["annotations"] = {"volcano.sh/gpu-memory-factor": "4"}
    node["status"]["capacity"]["volcano.sh/gpu-number"] = "3"
    node["status"]["allocatable"]["volcano.sh/gpu-number"] = "3"
    apiserver.create("nodes", node)
    apiserver.patch("nodes", "node-a", {"status": node["status"]}, subresource="status")
    publisher = start(kube, health, "share", factor=4)
    try:
        assert wait_for(lambda: publisher.published)
        assert apiserver.requests.count(method="PATCH") == 0
    finally:
        publisher.stop()


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (
            "share",
            NodeState(
                {"volcano.sh/gpu-unhealthy-ids": "2", "volcano.sh/gpu-memory-factor": "4"},
                {"volcano.sh/gpu-number": "3"},
            ),
        ),
        ("number", NodeState({"volcano.sh/gpu-unhealthy-ids": "2"}, {})),
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
            ),
        ),
    ],
)
def test_wanted_state_per_strategy(strategy: Strategy, expected: NodeState) -> None:
    health = {"GPU-0": True, "GPU-1": True, "GPU-2": False}
    assert wanted_node_state(strategy, GPUS, health, Layout(4)) == expected
