"""Allocate end to end: the daemon as a subprocess, pods in the API-server emulator, admitted by
the kubelet emulator (GetPreferredAllocation, Allocate, checkpoint, pod-resources) over real
sockets; crash recovery with kill -9."""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.api import podresources_grpc
from deviceplugin.api import podresources_pb2 as pr
from kubesim.admission import Admission
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import NODE, TIMEOUT_S, Daemon, eventually, streaming

MEM = "volcano.sh/gpu-memory"
NUM = "volcano.sh/gpu-number"


def launch(
    start: Callable[..., Daemon],
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    workdir: Path,
    *extra: str,
) -> Daemon:
    """Start the daemon (`extra`: more options) and wait until kubelet streams its devices and its
    pod cache has listed."""
    kubeconfig = apiserver.write_kubeconfig(workdir / "kubeconfig")
    daemon = start(
        "--fake-gpus",
        "2x10989",
        "--kubeconfig",
        str(kubeconfig),
        "--release-grace-period",
        "1",
        "--reconcile-interval",
        "0.5",
        *extra,
    )
    assert kubelet.wait_for(streaming(MEM), TIMEOUT_S), daemon.output()
    eventually(lambda: "pod cache listed" in daemon.output(), daemon)
    return daemon


@pytest.fixture
def share(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> Daemon:
    return launch(start, apiserver, kubelet, workdir)


def make_pod(
    apiserver: ApiServerEmulator,
    name: str,
    units: int,
    *,
    gpu_index: str = "0",
    predicate_time: int | str = 1,
    containers: list[tuple[str, int]] | None = None,
) -> dict[str, Any]:
    def container(n: str, u: int) -> dict[str, Any]:
        return {"name": n, "image": "cuda", "resources": {"limits": {MEM: str(u)} if u else {}}}

    pod = {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "annotations": {
                "volcano.sh/gpu-index": gpu_index,
                "volcano.sh/predicate-time": str(predicate_time),
            },
        },
        "spec": {
            "nodeName": NODE,
            "containers": [container(n, u) for n, u in containers or [("cuda", units)]],
        },
    }
    return apiserver.create("pods", pod)


def admit(kubelet: KubeletEmulator, pod: dict[str, Any], daemon: Daemon) -> Admission:
    admission = kubelet.admit(pod)
    assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
    return admission


def assigned(apiserver: ApiServerEmulator, name: str) -> bool:
    pod = apiserver.get("pods", name, "ml") or {}
    return bool(pod.get("metadata", {}).get("annotations", {}).get("volcano.sh/gpu-assigned") == "true")


def ledger_rows(workdir: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(workdir / "state" / "ledger.db") as db:
        return db.execute("SELECT pod_name, container, state FROM allocations ORDER BY pod_name").fetchall()


def test_the_documented_example(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, share: Daemon
) -> None:
    first = make_pod(apiserver, "first", 1024, predicate_time=100)
    second = make_pod(apiserver, "second", 1024, predicate_time=200)
    visible = set()
    for pod in (first, second):
        admission = admit(kubelet, pod, share)
        entry = admission.allocation("cuda", MEM)
        visible.add(entry.envs["NVIDIA_VISIBLE_DEVICES"])
        assert entry.envs["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
        assert (entry.envs["VOLCANO_GPU_ALLOCATED"], entry.envs["VOLCANO_GPU_TOTAL"]) == ("1024", "10989")
        assert entry.preferred_called and entry.preferred_used
        assert all(device.startswith("0-") for device in entry.device_ids)  # kubelet's records name GPU 0
    assert len(visible) == 1  # both on the same GPU 0
    eventually(lambda: assigned(apiserver, "first") and assigned(apiserver, "second"), share)
    in_use = kubelet.in_use(MEM)
    assert len(in_use) == 2048 and all(device.startswith("0-") for device in in_use)
    assert kubelet.pod_resources_socket is not None
    with grpc.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as channel:
        listed = podresources_grpc.PodResourcesListerStub(channel).List(
            pr.ListPodResourcesRequest(), timeout=5
        )
    devices = {
        pod.name: [d for c in pod.containers for entry in c.devices for d in entry.device_ids]
        for pod in listed.pod_resources
    }
    assert sorted(devices) == ["first", "second"]
    assert all(len(ids) == 1024 and all(d.startswith("0-") for d in ids) for ids in devices.values())


def test_number_mode_envs_are_upstreams_per_container(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """volcano-sh/devices' envs, but each container gets its own GPUs: upstream hands every
    container the pod's whole gpu-index and GPU 0's memory. VOLCANO_GPU_ALLOCATED keeps upstream's
    formula (GPUs x GPUMemoryFactor), so a migrated configuration reads the same value."""
    spec = workdir / "gpus.json"
    sizes = (("GPU-small", 10989), ("GPU-large", 32768), ("GPU-other", 10989))
    spec.write_text(json.dumps([{"uuid": u, "model": "Tesla V100", "memory_mib": m} for u, m in sizes]))
    kubeconfig = apiserver.write_kubeconfig(workdir / "kubeconfig")
    daemon = start(
        "--fake-gpus",
        str(spec),
        "--gpu-strategy",
        "number",
        "--gpu-memory-factor",
        "2",
        "--kubeconfig",
        str(kubeconfig),
    )
    assert kubelet.wait_for(streaming(NUM), TIMEOUT_S), daemon.output()
    eventually(lambda: "pod cache listed" in daemon.output(), daemon)
    pod = {
        "metadata": {
            "name": "pair",
            "namespace": "ml",
            "annotations": {"volcano.sh/gpu-index": "1,0,2", "volcano.sh/predicate-time": "1"},
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": "one", "image": "cuda", "resources": {"limits": {NUM: "1"}}},
                {"name": "two", "image": "cuda", "resources": {"limits": {NUM: "2"}}},
            ],
        },
    }
    admission = admit(kubelet, apiserver.create("pods", pod), daemon)
    wanted = {"one": ("GPU-large", "2", "32768"), "two": ("GPU-small,GPU-other", "4", "10989")}
    for container, (visible, allocated, total) in wanted.items():
        envs = admission.allocation(container, NUM).envs
        assert envs == {
            "NVIDIA_VISIBLE_DEVICES": visible,
            "VOLCANO_GPU_ALLOCATED": allocated,
            "VOLCANO_GPU_MEMORY_TOTAL": total,
            "VOLCANO_GPU_TOTAL": total,
        }
    eventually(lambda: assigned(apiserver, "pair"), daemon)


def test_multi_container_pod_and_a_failure_with_a_clear_message(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, share: Daemon
) -> None:
    pod = make_pod(apiserver, "multi", 0, containers=[("a", 100), ("plain", 0), ("b", 200)])
    admission = admit(kubelet, pod, share)
    assert [(e.container, len(e.device_ids)) for e in admission.allocations] == [("a", 100), ("b", 200)]
    eventually(lambda: assigned(apiserver, "multi"), share)
    bad = make_pod(apiserver, "bad", 10, gpu_index="9")
    refused = kubelet.admit(bad)
    assert not refused.admitted and refused.reason == "UnexpectedAdmissionError"
    assert "pod ml/bad container 'cuda': volcano.sh/gpu-index names GPU 9" in refused.message
    eventually(
        lambda: any(e["reason"] == "GpuAllocationFailed" for e in apiserver.list("events", "ml")), share
    )


def test_release_when_the_pod_goes(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, share: Daemon, workdir: Path
) -> None:
    deleted = make_pod(apiserver, "deleted", 10)
    forgotten = make_pod(apiserver, "forgotten", 20)
    admit(kubelet, deleted, share)
    admit(kubelet, forgotten, share)
    assert [row[2] for row in ledger_rows(workdir)] == ["allocated", "allocated"]

    def state_of(name: str) -> str | None:
        return {row[0]: row[2] for row in ledger_rows(workdir)}.get(name)

    apiserver.delete("pods", "deleted", "ml")  # the pod object goes: released at once
    eventually(lambda: state_of("deleted") == "released", share, 5)
    kubelet.release(forgotten["metadata"]["uid"])  # kubelet forgot it, the object stays: after the grace
    eventually(lambda: state_of("forgotten") == "released", share)


def test_kill_9_mid_stream_loses_and_doubles_nothing(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = launch(start, apiserver, kubelet, workdir)
    pods = [make_pod(apiserver, f"p{n:02d}", 64, predicate_time=n) for n in range(30)]
    results: dict[str, Admission] = {}
    eight_in = threading.Event()

    def admit_all() -> None:
        for pod in pods:
            results[pod["metadata"]["name"]] = kubelet.admit(pod)
            if len(results) == 8:
                eight_in.set()  # wakes the killer at once: polling for it let all 30 through under load

    feeder = threading.Thread(target=admit_all)
    feeder.start()
    assert eight_in.wait(TIMEOUT_S), daemon.output()
    daemon.process.send_signal(signal.SIGKILL)
    feeder.join(TIMEOUT_S * 2)
    admitted = {name for name, result in results.items() if result.admitted}
    assert 8 <= len(admitted) < 30
    restarted = launch(start, apiserver, kubelet, workdir)
    rows = ledger_rows(workdir)
    allocated = {name for name, _, state in rows if state == "allocated"}
    assert len(rows) == len({name for name, _, _ in rows})  # nothing doubled
    assert admitted <= allocated  # nothing served is lost
    assert len(allocated - admitted) <= 1  # at most the one cut short by the kill...
    eventually(
        lambda: {n for n, _, s in ledger_rows(workdir) if s == "allocated"} == admitted, restarted
    )  # ...released
    for pod in pods:  # kubelet re-sends Allocate for containers it has: the same answer comes back
        name = pod["metadata"]["name"]
        if name in admitted:
            before = results[name].allocation("cuda", MEM).response
            assert kubelet.reallocate(pod["metadata"]["uid"], "cuda", MEM) == before
    eventually(lambda: all(assigned(apiserver, name) for name in admitted), restarted)
    rest = [pod for pod in pods if pod["metadata"]["name"] not in admitted]
    for pod in rest:
        kubelet.release(pod["metadata"]["uid"])
        admit(kubelet, pod, restarted)
    eventually(lambda: all(assigned(apiserver, p["metadata"]["name"]) for p in pods), restarted)
    assert len([r for r in ledger_rows(workdir) if r[2] == "allocated"]) == 30


def test_api_outage(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    cached = make_pod(apiserver, "cached", 16)
    share = launch(start, apiserver, kubelet, workdir)  # its pod cache has listed the pod
    apiserver.faults.error(503)
    apiserver.drop_watches()
    admit(kubelet, cached, share)  # served from the cache
    unseen = dict(cached)
    unseen["metadata"] = {**cached["metadata"], "uid": "never-seen", "name": "unseen"}
    refused = kubelet.admit(unseen)
    assert not refused.admitted
    assert "cannot tell which pod asks for" in refused.message
    assert not assigned(apiserver, "cached")
    apiserver.faults.clear()
    eventually(lambda: assigned(apiserver, "cached"), share, 30)
