"""An Allocate that waits for its pod does not hold up the others (issue 13): the daemon as a
subprocess, Allocate calls sent straight to its plugin socket from two threads (kubelet sends
one at a time, but the daemon serves several resources and must not rely on that)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import grpc

from deviceplugin.api import deviceplugin_grpc
from deviceplugin.api import deviceplugin_pb2 as pb
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import TIMEOUT_S, Daemon, eventually, state
from tests.e2e import test_allocate as alloc
from tests.e2e.test_outbox import metric


def allocate(socket: Path, device_ids: list[str]) -> dict[str, str]:
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=device_ids)])
        answer = deviceplugin_grpc.DevicePluginStub(channel).Allocate(request, timeout=TIMEOUT_S)
    (container,) = answer.container_responses
    return dict(container.envs)


def test_an_allocate_waiting_for_an_unseen_pod_does_not_delay_a_cached_one(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """Issue 13: the Allocate waiting (up to --allocate-timeout) for a pod the cache had not seen
    held the allocator's lock, so the Allocate of a pod already cached waited as long."""
    alloc.make_pod(apiserver, "cached", 200)
    daemon = alloc.launch(start, apiserver, kubelet, workdir, "--allocate-timeout", "60")
    socket = workdir / "plugins" / state(kubelet, alloc.MEM).endpoint
    waiting: dict[str, dict[str, str]] = {}
    late_ids = [f"1-{n}" for n in range(100)]
    unseen = threading.Thread(target=lambda: waiting.update(late=allocate(socket, late_ids)))
    unseen.start()
    try:
        eventually(lambda: metric(daemon, "allocate_waiting", resource=alloc.MEM) == 1, daemon)
        served = allocate(socket, [f"0-{n}" for n in range(200)])
        assert served["VOLCANO_GPU_ALLOCATED"] == "200"
        assert unseen.is_alive() and not waiting  # still waiting for its pod
        alloc.make_pod(apiserver, "late", 100, gpu_index="1")
    finally:
        unseen.join(TIMEOUT_S)
    assert waiting["late"]["VOLCANO_GPU_ALLOCATED"] == "100"
    assert metric(daemon, "allocate_waiting", resource=alloc.MEM) == 0
    assert [(name, row_state) for name, _, row_state in alloc.ledger_rows(workdir)] == [
        ("cached", "allocated"),
        ("late", "allocated"),
    ]
