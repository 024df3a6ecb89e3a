"""Which pods the extender books, as Volcano's scheduler cache books them under compat="volcano"
(Succeeded/Failed never; Running or Pending with a deletionTimestamp not; Unknown yes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import (
    StartExtender,
    create_pod,
    eventually,
    gpu_pod,
    gpu_uuid,
    memory_pod,
    share_node,
    vgpu_node,
)

VGPU_IDS = "volcano.sh/vgpu-ids-new"
VGPU_4000 = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "4000"}


@pytest.fixture
def apiserver() -> Iterator[ApiServerEmulator]:
    """An emulator that, like a real API server, keeps a deleted pod until its kubelet is done."""
    with ApiServerEmulator(bookmark_interval_s=0.5, graceful_pod_deletion=True) as server:
        yield server


def _set_phase(apiserver: ApiServerEmulator, name: str, phase: str) -> None:
    apiserver.patch("pods", name, {"status": {"phase": phase}}, "default", subresource="status")


def _terminating(apiserver: ApiServerEmulator, name: str, phase: str) -> None:
    create_pod(apiserver, memory_pod(name, 12000, node="n1", annotations={"volcano.sh/gpu-index": "0"}))
    _set_phase(apiserver, name, phase)
    apiserver.delete("pods", name, "default", grace_period_s=30)  # stays, with a deletionTimestamp


@pytest.mark.parametrize(
    ("phase", "booked_by_default", "booked_by_volcano"),
    [
        pytest.param("Running", True, False, id="running-is-releasing-in-volcano"),
        pytest.param("Pending", True, False, id="pending-is-releasing-in-volcano"),
        pytest.param("Unknown", True, True, id="unknown-stays-booked"),
    ],
)
def test_terminating_pods(
    apiserver: ApiServerEmulator,
    start_extender: StartExtender,
    phase: str,
    booked_by_default: bool,
    booked_by_volcano: bool,
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=1, memory=16000))
    extenders = [
        (booked_by_default, start_extender(strategy="share")),
        (booked_by_volcano, start_extender(strategy="share", compat="volcano")),
    ]
    _terminating(apiserver, "leaving", phase)
    # Created last: once an extender books the marker it has seen every earlier event.
    create_pod(apiserver, memory_pod("marker", 1000, node="n1", annotations={"volcano.sh/gpu-index": "0"}))
    for booked, extender in extenders:
        free = 16000 - 1000 - (12000 if booked else 0)
        client = extender.client
        eventually(lambda: client.filter(memory_pod("probe", 15001), ["n1"])["NodeNames"] == [])  # noqa: B023
        assert client.filter(memory_pod("fits", free), ["n1"])["NodeNames"] == ["n1"]
        assert client.filter(memory_pod("too-big", free + 1), ["n1"])["NodeNames"] == []


@pytest.mark.parametrize("compat", [None, "volcano"])
def test_a_finished_pod_lingering_on_the_node_books_nothing(
    apiserver: ApiServerEmulator, start_extender: StartExtender, compat: str | None
) -> None:
    apiserver.create("nodes", share_node("n1", gpus=1, memory=16000))
    extender = start_extender(strategy="share", compat=compat)
    placed = {"volcano.sh/gpu-index": "0"}
    done = create_pod(apiserver, memory_pod("done", 12000, node="n1", annotations=placed))
    pod = create_pod(apiserver, memory_pod("new", 8000))
    eventually(lambda: extender.client.filter(pod, ["n1"])["NodeNames"] == [])
    _set_phase(apiserver, done["metadata"]["name"], "Succeeded")
    eventually(lambda: extender.client.filter(pod, ["n1"])["NodeNames"] == ["n1"])


def test_a_vgpu_pod_with_two_containers_on_one_card_is_booked_once_by_volcano(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """Volcano's AddResource books a pod once per card (its first device there); the default
    books every container's device, so the card's other 8000 MiB are not offered twice."""
    apiserver.create("nodes", vgpu_node("n1", gpus=1, memory=16000))
    default, volcano = start_extender(strategy="vgpu"), start_extender(strategy="vgpu", compat="volcano")
    card = gpu_uuid("n1", 0)
    both = f"{card},NVIDIA,4000,10:;{card},NVIDIA,4000,10:"
    pair = gpu_pod("pair", VGPU_4000, node="n1", annotations={VGPU_IDS: both})
    pair["spec"]["containers"].append({**pair["spec"]["containers"][0], "name": "second"})
    create_pod(apiserver, pair)
    for extender, free in ((default, 8000), (volcano, 12000)):
        client = extender.client
        eventually(lambda: client.filter(vgpu_probe(16000), ["n1"])["NodeNames"] == [])  # noqa: B023
        assert client.filter(vgpu_probe(free), ["n1"])["NodeNames"] == ["n1"]
        assert client.filter(vgpu_probe(free + 1), ["n1"])["NodeNames"] == []


def vgpu_probe(memory: int) -> dict[str, object]:
    return gpu_pod("probe", {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": str(memory)})
