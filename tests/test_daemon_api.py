"""The daemon with the Kubernetes API: node state, events, and outages (API-server emulator over
HTTP, kubelet emulator over Unix sockets, the daemon as a subprocess)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from deviceplugin.gpu.fake import fake_uuid
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import TIMEOUT_S, Daemon, eventually, inject, state, streaming

NODE = "node-1"


@pytest.fixture
def apiserver(apiserver: ApiServerEmulator) -> ApiServerEmulator:
    apiserver.create("nodes", {"metadata": {"name": NODE}, "status": {"capacity": {"cpu": "8"}}})
    return apiserver


@pytest.fixture
def running(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> tuple[Daemon, Path]:
    events = workdir / "events.jsonl"
    kubeconfig = apiserver.write_kubeconfig(workdir / "kubeconfig")
    daemon = start(
        "--fake-gpus",
        "2x1000",
        "--fake-gpu-events",
        str(events),
        "--kubeconfig",
        str(kubeconfig),
        "--gpu-memory-factor",
        "auto",
        "--health-recovery-period",
        "60",
    )
    assert kubelet.wait_for(streaming("volcano.sh/gpu-memory"), TIMEOUT_S), daemon.output()
    return daemon, events


def node_annotations(apiserver: ApiServerEmulator) -> dict[str, str]:
    node = apiserver.get("nodes", NODE)
    assert node is not None
    return dict(node["metadata"].get("annotations") or {})


def gpu_number(apiserver: ApiServerEmulator, section: str = "capacity") -> str | None:
    node = apiserver.get("nodes", NODE) or {}
    value = node.get("status", {}).get(section, {}).get("volcano.sh/gpu-number")
    return None if value is None else str(value)


def test_node_state_and_pod_cache(apiserver: ApiServerEmulator, running: tuple[Daemon, Path]) -> None:
    daemon, _ = running
    eventually(lambda: node_annotations(apiserver).get("volcano.sh/gpu-memory-factor") == "1", daemon)
    eventually(lambda: gpu_number(apiserver) == "2", daemon)
    eventually(lambda: "pod cache listed" in daemon.output(), daemon)
    # list, then watch: logged after the list, the line does not say the watch is open yet
    eventually(lambda: apiserver.requests.count(path="fieldSelector=spec.nodeName%3Dnode-1") >= 2, daemon)


def test_unhealthy_gpu_reaches_the_node_and_an_event(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, running: tuple[Daemon, Path]
) -> None:
    daemon, events = running
    inject(events, xid=79, uuid=fake_uuid(1))
    eventually(lambda: node_annotations(apiserver).get("volcano.sh/gpu-unhealthy-ids") == "1", daemon)
    # kubelet hears it on its own path (ListAndWatch), not necessarily before the node annotation
    assert kubelet.wait_for(lambda k: state(k, "volcano.sh/gpu-memory").allocatable == 1000, TIMEOUT_S)

    def event_posted() -> bool:
        return any(e["reason"] == "GpuUnhealthy" for e in apiserver.list("events", "default"))

    eventually(event_posted, daemon)
    (event,) = [e for e in apiserver.list("events", "default") if e["reason"] == "GpuUnhealthy"]
    assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == NODE
    assert f"GPU 1 ({fake_uuid(1)}) is unhealthy: Xid 79" in event["message"]


def test_api_outage_does_not_stop_the_daemon(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, running: tuple[Daemon, Path]
) -> None:
    daemon, events = running
    eventually(lambda: "volcano.sh/gpu-memory-factor" in node_annotations(apiserver), daemon)
    apiserver.faults.error(503)
    apiserver.drop_watches()
    before = len(apiserver.requests.records())
    inject(events, xid=79, uuid=fake_uuid(0))
    # kubelet still hears about it: ListAndWatch does not depend on the API server
    assert kubelet.wait_for(lambda k: state(k, "volcano.sh/gpu-memory").allocatable == 1000, TIMEOUT_S)

    def node_publisher_refused() -> bool:  # its read or its write of the node, refused
        records = apiserver.requests.records()[before:]
        return any(r.code == 503 and f"/nodes/{NODE}" in r.path for r in records)

    eventually(node_publisher_refused, daemon)  # the daemon tried to publish it, and failed
    apiserver.faults.clear()
    apiserver.faults.hang()  # then the API stops answering at all
    kubelet.restart()
    assert kubelet.wait_for(lambda k: k.restarts == 1 and streaming("volcano.sh/gpu-memory")(k), TIMEOUT_S)
    assert daemon.process.poll() is None
    assert "volcano.sh/gpu-unhealthy-ids" not in node_annotations(apiserver)
    apiserver.faults.clear()
    eventually(lambda: node_annotations(apiserver).get("volcano.sh/gpu-unhealthy-ids") == "0", daemon, 30)


def test_kubelet_re_registration_restores_gpu_number(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """A kubelet restarting after a reboot resets extended resources in node status. With the node
    watch down and no periodic read due, only the re-registration can make the daemon look."""
    daemon = start(
        "--fake-gpus",
        "2x1000",
        "--kubeconfig",
        str(apiserver.write_kubeconfig(workdir / "kubeconfig")),
        "--node-resync-interval",
        "600",
    )
    assert kubelet.wait_for(streaming("volcano.sh/gpu-memory"), TIMEOUT_S), daemon.output()
    eventually(lambda: gpu_number(apiserver) == "2", daemon)
    before = len(apiserver.requests.records())
    apiserver.faults.error(503, path="fieldSelector=metadata.name")  # the node watch's list and watch
    apiserver.drop_watches()
    eventually(
        lambda: any(
            r.code == 503 and "fieldSelector=metadata.name" in r.target
            for r in apiserver.requests.records()[before:]
        ),
        daemon,
    )
    reset = {"volcano.sh/gpu-number": "0"}
    apiserver.patch(
        "nodes", NODE, {"status": {"capacity": reset, "allocatable": reset}}, subresource="status"
    )
    kubelet.restart()
    eventually(lambda: gpu_number(apiserver) == gpu_number(apiserver, "allocatable") == "2", daemon)
    apiserver.faults.clear()


def test_unusable_kubeconfig_is_a_configuration_error(workdir: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "deviceplugin.cli",
            "run",
            "--node-name",
            NODE,
            "--fake-gpus",
            "1x100",
            "--device-plugin-dir",
            str(workdir / "plugins"),
            "--kubeconfig",
            str(workdir / "missing"),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2
    assert f"cannot use the kubeconfig {workdir / 'missing'}" in done.stderr
