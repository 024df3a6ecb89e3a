"""Every background worker of the daemon is supervised (issue 13, item 2): the daemon as a
subprocess, the API-server and kubelet emulators over real sockets, fake GPUs. Each test makes one
worker crash on every restart, sees `/readyz` answer 503 naming it as restarting in a loop (with
the exception), its crashes logged and counted on `/metrics`; ends the fault; sees `/readyz` 200
again and the worker's work done.

The faults are real ones at the boundaries where a boundary reaches the worker: the API server
answering with a body the client cannot read (pod cache, node watch, node publisher), the GPU
backend raising an error it is not meant to (GPU health). Events, release, registrar, the outbox
and the vGPU handshake meet no such fault in their loop (the last two send PATCHes whose answers
they do not read): the supervisor's test hook crashes them ($DEVICEPLUGIN_WORKER_FAULTS names them).
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable
from pathlib import Path

import pytest

from deviceplugin.supervisor import FAULTS_ENV
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import GPU0, GPU1, NODE, TIMEOUT_S, Daemon, eventually, inject, streaming
from tests.e2e import test_allocate as share
from tests.e2e import test_vgpu as vgpu
from tests.volcano_handshake import stamp

RECOVERY_S = 60.0  # the back-off doubles while a slow test looks: give the restart time
FACTOR = "volcano.sh/gpu-memory-factor"
UNHEALTHY = "volcano.sh/gpu-unhealthy-ids"
SHARE_WORKERS = {
    "pod-cache",
    "node-cache",
    "node-publisher",
    "outbox",
    "events",
    "release",
    "registrar",
    "gpu-health",
}


class Rig:
    """A share-mode daemon with fake GPU events and the supervisor's test hook file."""

    def __init__(self, start: Callable[..., Daemon], workdir: Path, apiserver: ApiServerEmulator) -> None:
        self.events = workdir / "gpu-events.jsonl"
        self.faults = workdir / "worker-faults"
        self.daemon = start(
            "--fake-gpus",
            "2x10989",
            "--fake-gpu-events",
            str(self.events),
            "--kubeconfig",
            str(apiserver.write_kubeconfig(workdir / "kubeconfig")),
            "--release-grace-period",
            "1",
            "--reconcile-interval",
            "0.5",
            "--node-resync-interval",
            "3600",  # a foreign change is seen through the node watch only
            env={FAULTS_ENV: str(self.faults)},
        )


@pytest.fixture
def rig(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> Rig:
    rig = Rig(start, workdir, apiserver)
    assert kubelet.wait_for(streaming(share.MEM), TIMEOUT_S), rig.daemon.output()
    eventually(lambda: readyz(rig.daemon) == (200, "ok\n"), rig.daemon)
    eventually(lambda: FACTOR in vgpu.notes(apiserver, "nodes", NODE), rig.daemon)
    return rig


def readyz(daemon: Daemon) -> tuple[int, str]:
    return vgpu.get(daemon.metrics_url() + "/readyz")


def restarts(daemon: Daemon) -> dict[str, float]:
    found = vgpu.samples(daemon, "volcano_gpu_plugin_worker_restarts_total")
    return {dict(labels)["worker"]: value for labels, value in found.items()}


def crash_loop(
    daemon: Daemon,
    worker: str,
    exception: str,
    end_fault: Callable[[], object],
    meanwhile: Callable[[], object] = lambda: None,
) -> None:
    """The fault is on: wait for `/readyz` to name `worker` as restarting in a loop; check the log
    and the count; do `meanwhile`; end the fault; wait for ready."""
    eventually(lambda: f"worker {worker} is restarting in a loop" in readyz(daemon)[1], daemon)
    status, body = readyz(daemon)
    assert status == 503 and exception in body, body
    assert restarts(daemon)[worker] >= 3
    crashes = [line for line in daemon.output().splitlines() if "worker crashed, restarting" in line]
    assert any(f"worker={worker}" in line and exception in line for line in crashes), daemon.output()
    meanwhile()
    end_fault()
    eventually(lambda: readyz(daemon) == (200, "ok\n"), daemon, RECOVERY_S)


def test_every_background_worker_of_the_daemon_is_supervised(rig: Rig) -> None:
    assert restarts(rig.daemon) == dict.fromkeys(SHARE_WORKERS, 0)


def test_pod_cache_recovers_and_a_pod_created_meanwhile_is_served(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, rig: Rig
) -> None:
    garbled = apiserver.faults.garble(method="GET", path="/api/v1/pods")
    apiserver.drop_watches()
    created: list[dict[str, object]] = []
    crash_loop(
        rig.daemon,
        "pod-cache",
        "JSONDecodeError",
        lambda: apiserver.faults.clear(garbled),
        lambda: created.append(share.make_pod(apiserver, "meanwhile", 1024)),
    )
    admission = share.admit(kubelet, created[0], rig.daemon)
    assert admission.allocation("cuda", share.MEM).envs["VOLCANO_GPU_ALLOCATED"] == "1024"


def test_node_watch_recovers_and_a_change_made_meanwhile_is_restored(
    apiserver: ApiServerEmulator, rig: Rig
) -> None:
    garbled = apiserver.faults.garble(method="GET", path="/api/v1/nodes?")  # list and watch
    apiserver.drop_watches()
    crash_loop(
        rig.daemon,
        "node-cache",
        "JSONDecodeError",
        lambda: apiserver.faults.clear(garbled),
        lambda: apiserver.patch("nodes", NODE, {"metadata": {"annotations": {FACTOR: "7"}}}),
    )
    eventually(lambda: vgpu.notes(apiserver, "nodes", NODE)[FACTOR] == "1", rig.daemon)


def test_node_publisher_recovers_and_restores_the_node(apiserver: ApiServerEmulator, rig: Rig) -> None:
    garbled = apiserver.faults.garble(method="GET", path=f"/api/v1/nodes/{NODE}")
    apiserver.patch("nodes", NODE, {"metadata": {"annotations": {FACTOR: "7"}}})  # the publisher reads
    crash_loop(rig.daemon, "node-publisher", "JSONDecodeError", lambda: apiserver.faults.clear(garbled))
    eventually(lambda: vgpu.notes(apiserver, "nodes", NODE)[FACTOR] == "1", rig.daemon)


def test_outbox_recovers_and_applies_what_is_queued_after(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, rig: Rig
) -> None:
    rig.faults.write_text("outbox\n")
    share.admit(kubelet, share.make_pod(apiserver, "first", 1024), rig.daemon)  # wakes the idle worker
    crash_loop(rig.daemon, "outbox", "InjectedFault", lambda: rig.faults.write_text(""))
    share.admit(kubelet, share.make_pod(apiserver, "after", 1024), rig.daemon)
    eventually(lambda: share.assigned(apiserver, "first") and share.assigned(apiserver, "after"), rig.daemon)


def test_gpu_health_recovers_and_acts_on_the_next_xid(apiserver: ApiServerEmulator, rig: Rig) -> None:
    inject(rig.events, **{"raise": "the driver is in a state nobody expected"})
    crash_loop(rig.daemon, "gpu-health", "RuntimeError", lambda: inject(rig.events, **{"raise": None}))
    inject(rig.events, xid=79, uuid=GPU0)
    eventually(lambda: vgpu.notes(apiserver, "nodes", NODE).get(UNHEALTHY) == "0", rig.daemon)


def unhealthy_events(apiserver: ApiServerEmulator) -> list[str]:
    return [e["message"] for e in apiserver.list("events", "default") if e["reason"] == "GpuUnhealthy"]


def test_events_recovers_and_posts_what_was_queued_meanwhile(apiserver: ApiServerEmulator, rig: Rig) -> None:
    rig.faults.write_text("events\n")
    inject(rig.events, xid=79, uuid=GPU0)  # wakes the worker: it posts this one, then crashes at its turn
    crash_loop(
        rig.daemon,
        "events",
        "InjectedFault",
        lambda: rig.faults.write_text(""),
        lambda: inject(rig.events, xid=79, uuid=GPU1),  # this GpuUnhealthy event waits in the queue
    )
    eventually(lambda: any(GPU1 in message for message in unhealthy_events(apiserver)), rig.daemon)


def test_release_recovers_and_frees_a_container_kubelet_forgot(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, rig: Rig, workdir: Path
) -> None:
    rig.faults.write_text("release\n")
    crash_loop(rig.daemon, "release", "InjectedFault", lambda: rig.faults.write_text(""))
    forgotten = share.make_pod(apiserver, "forgotten", 20)
    share.admit(kubelet, forgotten, rig.daemon)
    kubelet.release(forgotten["metadata"]["uid"])  # kubelet forgot it, the object stays
    eventually(lambda: share.ledger_rows(workdir) == [("forgotten", "cuda", "released")], rig.daemon)


def test_registrar_recovers_and_registers_with_a_restarted_kubelet(
    kubelet: KubeletEmulator, rig: Rig
) -> None:
    rig.faults.write_text("registrar\n")
    crash_loop(rig.daemon, "registrar", "InjectedFault", lambda: rig.faults.write_text(""))
    registered = len(kubelet.registrations)
    kubelet.restart()
    assert kubelet.wait_for(lambda k: len(k.registrations) > registered, TIMEOUT_S), rig.daemon.output()
    eventually(lambda: readyz(rig.daemon) == (200, "ok\n"), rig.daemon)


def test_vgpu_handshake_recovers_and_answers_a_request_after(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    faults = workdir / "worker-faults"
    with_hook = functools.partial(start, env={FAULTS_ENV: str(faults)})
    daemon = vgpu.launch(
        with_hook, apiserver, kubelet, workdir, "--fake-gpus", "1x4914", "--vgpu-handshake-interval", "0.3"
    )
    eventually(
        lambda: vgpu.notes(apiserver, "nodes", NODE).get(vgpu.HANDSHAKE, "").startswith("Reported "), daemon
    )
    assert restarts(daemon) == dict.fromkeys(SHARE_WORKERS | {"vgpu-handshake"}, 0)
    faults.write_text("vgpu-handshake\n")

    def request() -> None:  # wakes the worker (it answers, then its turn meets the fault while on)
        asked = stamp("Requesting", datetime.datetime.now())
        apiserver.patch("nodes", NODE, {"metadata": {"annotations": {vgpu.HANDSHAKE: asked}}})

    request()
    crash_loop(daemon, "vgpu-handshake", "InjectedFault", lambda: faults.write_text(""))
    request()
    eventually(
        lambda: vgpu.notes(apiserver, "nodes", NODE).get(vgpu.HANDSHAKE, "").startswith("Reported "), daemon
    )
