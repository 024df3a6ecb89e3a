"""A corrupt ledger at start-up (issue 13, item 3) is moved aside and rebuilt from kubelet's
pod-resources `List` and the pods' annotations: the daemon as a subprocess, stopped, its ledger
spoiled, started again; pods in the API-server emulator, admitted by the kubelet emulator over
real sockets. Before: the daemon exited (`--state-dir ...: file is not a database`), kubelet
restarted it into the same exit: a crash loop, no GPU pod admitted on the node."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict

from deviceplugin.api import deviceplugin_pb2 as pb
from kubesim.admission import Admission
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import GPU0, NODE, TIMEOUT_S, VGPU, Daemon, eventually, streaming
from tests.e2e import test_allocate as share
from tests.e2e import test_vgpu as vgpu
from tests.test_ledger import _damaged, _foreign, _index_off, _not_a_database

SPOILS = [
    pytest.param(_not_a_database, id="not-sqlite"),
    pytest.param(_damaged, id="malformed"),
    pytest.param(_index_off, id="integrity"),
    pytest.param(_foreign, id="foreign-schema"),
]
GPU_ROWS = (
    "SELECT a.pod_name, a.container, a.resource, g.gpu_index, g.memory, g.cores, a.device_key, a.response"
    " FROM allocations a JOIN allocation_gpus g USING (pod_uid, container, resource)"
    " WHERE a.state = 'allocated'"
)
KEYS = "SELECT pod_name, container, resource FROM allocations WHERE state = 'allocated'"


def live_rows(state: Path, query: str = GPU_ROWS) -> set[tuple[Any, ...]]:
    """The live rows; a response as what it says (protobuf writes a map in any order)."""
    with contextlib.closing(sqlite3.connect(state / "ledger.db")) as db:
        rows = db.execute(query).fetchall()
    return {tuple(said(value) if isinstance(value, bytes) else value for value in row) for row in rows}


def said(response: bytes) -> str:
    return json.dumps(MessageToDict(pb.ContainerAllocateResponse.FromString(response)), sort_keys=True)


def rebuilt_events(apiserver: ApiServerEmulator) -> list[dict[str, Any]]:
    return [
        event
        for event in apiserver.list("events", "default")
        if event["involvedObject"]["name"] == NODE and event["reason"] == "LedgerRebuilt"
    ]


def moved_aside(state: Path) -> list[Path]:
    return sorted(path for path in state.iterdir() if ".corrupt-" in path.name)


@pytest.mark.parametrize("spoil", SPOILS)
def test_a_corrupt_share_ledger_is_moved_aside_and_rebuilt(
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    start: Callable[..., Daemon],
    workdir: Path,
    spoil: Callable[[Path], None],
) -> None:
    """What comes back: every container kubelet lists whose pod still says where it runs, with
    its GPU, memory, kubelet's device IDs and the very response it got; a booking whose patch was
    still queued is written again. What cannot, and why: a pod whose gpu-index was removed
    meanwhile, and one the API server no longer has."""
    state = workdir / "state"
    daemon = share.launch(start, apiserver, kubelet, workdir)
    first = share.admit(kubelet, share.make_pod(apiserver, "first", 1024), daemon)
    share.admit(
        kubelet,
        share.make_pod(apiserver, "pair", 0, gpu_index="1", containers=[("cuda", 512), ("side", 256)]),
        daemon,
    )
    share.admit(kubelet, share.make_pod(apiserver, "changed", 2048), daemon)
    share.admit(kubelet, share.make_pod(apiserver, "gone", 4096), daemon)
    refusing = apiserver.faults.error(503, method="PATCH", path="/pods/unsent")
    share.admit(kubelet, share.make_pod(apiserver, "unsent", 128), daemon)
    eventually(lambda: refusing.hits >= 1, daemon)  # its gpu-assigned waits in the outbox
    served = ("first", "pair", "changed", "gone")
    eventually(lambda: all(share.assigned(apiserver, name) for name in served), daemon)
    before = live_rows(state)
    assert daemon.stop() == 0

    apiserver.patch("pods", "changed", {"metadata": {"annotations": {"volcano.sh/gpu-index": None}}}, "ml")
    apiserver.delete("pods", "gone", "ml")
    spoil(state / "ledger.db")
    spoiled = (state / "ledger.db").read_bytes()
    daemon = share.launch(start, apiserver, kubelet, workdir)

    (aside,) = moved_aside(state)
    assert aside.read_bytes() == spoiled
    assert live_rows(state) == {row for row in before if row[0] not in ("changed", "gone")}
    eventually(lambda: len(rebuilt_events(apiserver)) == 1, daemon)
    message = rebuilt_events(apiserver)[0]["message"]
    assert f"moved aside as {aside}" in message and "4 allocation(s) rebuilt" in message, message
    assert "2 could not be: " in message, message
    assert "pod ml/changed container 'cuda': no volcano.sh/gpu-index annotation" in message, message
    assert "pod ml/gone container 'cuda': the API server binds no such pod to node node-1" in message
    assert (
        kubelet.reallocate(first.pod.uid, "cuda", share.MEM) == first.allocation("cuda", share.MEM).response
    )
    apiserver.faults.clear(refusing)
    eventually(lambda: share.assigned(apiserver, "unsent"), daemon)
    assert vgpu.get(daemon.metrics_url() + "/readyz") == (200, "ok\n")

    share.admit(kubelet, share.make_pod(apiserver, "after", 1024, gpu_index="1"), daemon)
    assert ("after", "cuda", share.MEM) in live_rows(state, KEYS)


def serve_vgpu_worker(
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    start: Callable[..., Daemon],
    workdir: Path,
    *args: str,
) -> tuple[Daemon, dict[str, Any], Admission, Path]:
    """A vGPU daemon that has served pod `worker` (bind-phase success), the pod, its admission and
    the HAMi-core cache directory its container mounts, with a file in it."""
    daemon = vgpu.launch(start, apiserver, kubelet, workdir, *args)
    pod = vgpu.worker(apiserver, "worker", 2048, 30, 1000, gpu=GPU0)
    admission = kubelet.admit(pod)
    assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
    eventually(
        lambda: vgpu.notes(apiserver, "pods", "worker").get("volcano.sh/bind-phase") == "success", daemon
    )
    cache = workdir / "hook" / "vgpu" / "containers" / f"{pod['metadata']['uid']}_worker"
    (cache / "state").write_text("HAMi-core's shared region")
    return daemon, pod, admission, cache


def test_a_corrupt_vgpu_ledger_is_rebuilt_with_the_containers_caches_kept(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """A vGPU container's row comes back from `vgpu-ids-new` (its `devices-to-allocate` slot was
    emptied when it was served) with the same response, HAMi-core's cache directory it mounts is
    left alone, and the pod stays `bind-phase: success`."""
    state = workdir / "state"
    args = ("--fake-gpus", "2x10989")
    daemon, pod, admission, cache = serve_vgpu_worker(apiserver, kubelet, start, workdir, *args)
    before = live_rows(state, KEYS)
    assert daemon.stop() == 0

    _not_a_database(state / "ledger.db")
    daemon = start(
        "--gpu-strategy",
        "vgpu",
        "--hook-path",
        str(workdir / "hook"),
        "--kubeconfig",
        str(workdir / "kubeconfig"),
        *args,
    )
    assert kubelet.wait_for(streaming(*VGPU), TIMEOUT_S), daemon.output()
    eventually(lambda: len(rebuilt_events(apiserver)) == 1, daemon)
    assert "2 allocation(s) rebuilt" in rebuilt_events(apiserver)[0]["message"]  # vgpu-number and -memory
    assert live_rows(state, KEYS) == before
    number = admission.allocation("worker", vgpu.NUMBER).response
    assert kubelet.reallocate(pod["metadata"]["uid"], "worker", vgpu.NUMBER) == number
    assert (cache / "state").read_text() == "HAMi-core's shared region"
    assert vgpu.notes(apiserver, "pods", "worker")["volcano.sh/bind-phase"] == "success"
