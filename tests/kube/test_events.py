"""Kubernetes Events posted in the background through the API-server emulator."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from deviceplugin.kube.api import Kube
from deviceplugin.kube.events import EventRecorder, Involved
from kubesim.apiserver import ApiServerEmulator
from tests.kube.objects import pod_object
from tests.kube.waiting import wait_for


@pytest.fixture
def recorder(kube: Kube) -> Iterator[EventRecorder]:
    events = EventRecorder(kube, "node-a")
    events.start()
    yield events
    events.stop()


def wait_events(apiserver: ApiServerEmulator, count: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    wait_for(lambda: len(apiserver.list("events", "default")) >= count, timeout_s)
    return apiserver.list("events", "default")


def test_pod_event_names_the_pod_and_the_reason(
    apiserver: ApiServerEmulator, recorder: EventRecorder
) -> None:
    pod = apiserver.create("pods", pod_object("train-0", "node-a"))
    recorder.warning(Involved.pod(pod), "GpuAllocationFailed", "no pending pod asks for 3 GPUs")
    (event,) = wait_events(apiserver, 1)
    assert event["involvedObject"] == {
        "kind": "Pod",
        "name": "train-0",
        "namespace": "default",
        "uid": pod["metadata"]["uid"],
        "apiVersion": "v1",
    }
    assert (event["type"], event["reason"], event["message"]) == (
        "Warning",
        "GpuAllocationFailed",
        "no pending pod asks for 3 GPUs",
    )
    assert event["source"] == {"component": "volcano-gpu-device-plugin", "host": "node-a"}
    assert event["metadata"]["name"].startswith("train-0.")


def test_node_event(apiserver: ApiServerEmulator, recorder: EventRecorder) -> None:
    recorder.normal(Involved.node("node-a", uid="node-a"), "GpuHealthy", "GPU 0 is healthy again")
    (event,) = wait_events(apiserver, 1)
    assert event["involvedObject"]["kind"] == "Node"
    assert "namespace" not in event["involvedObject"]
    assert event["metadata"]["namespace"] == "default"


def test_events_wait_out_an_outage(apiserver: ApiServerEmulator, recorder: EventRecorder) -> None:
    apiserver.faults.error(503, method="POST", times=3)
    recorder.warning(Involved.node("node-a"), "GpuUnhealthy", "GPU 1 is unhealthy")
    (event,) = wait_events(apiserver, 1)
    assert event["reason"] == "GpuUnhealthy"
    assert apiserver.requests.count(method="POST", path="events") == 4


def test_calls_never_block_on_the_api(apiserver: ApiServerEmulator, recorder: EventRecorder) -> None:
    hang = apiserver.faults.hang(method="POST")  # held until cleared: a call that waited would hang

    def warn_50_times() -> None:
        for n in range(50):
            recorder.warning(Involved.node("node-a"), "GpuUnhealthy", f"event {n}")

    caller = threading.Thread(target=warn_50_times)
    caller.start()
    assert wait_for(lambda: not caller.is_alive())  # all 50 returned while the API hangs...
    assert wait_for(lambda: hang.hits >= 1)  # ...with the first post held there
    assert apiserver.list("events", "default") == []
    apiserver.faults.clear(hang)
    assert len(wait_events(apiserver, 50, timeout_s=30)) == 50
