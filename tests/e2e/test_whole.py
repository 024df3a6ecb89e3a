"""The `whole` strategy end to end (docs/whole.md): the daemon as a subprocess advertising
`nvidia.com/gpu` on NVIDIA's socket name, pods admitted by the kubelet emulator over real sockets,
the API-server emulator; a pod placed by a plain kube-scheduler (no annotation) and one the
extender placed (`gpu-index`), health, the ledger and a restart."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.gpu.fake import fake_uuid
from deviceplugin.plugin.devices import RESOURCES
from kubesim.admission import Admission
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import NODE, TIMEOUT_S, Daemon, eventually, inject, state, streaming

GPU = "nvidia.com/gpu"
UUIDS = [fake_uuid(index) for index in range(4)]
SHARING = ("volcano.sh/gpu-memory", "volcano.sh/gpu-number", "volcano.sh/vgpu-number")


def launch(
    start: Callable[..., Daemon],
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    workdir: Path,
    *extra: str,
    strategy: str = "whole",
) -> Daemon:
    daemon = start(
        "--fake-gpus",
        "4x40960",
        "--gpu-strategy",
        strategy,
        "--kubeconfig",
        str(apiserver.write_kubeconfig(workdir / "kubeconfig")),
        "--node-resync-interval",
        "0.1",
        *extra,
    )
    assert kubelet.wait_for(streaming(RESOURCES[strategy][0].name), TIMEOUT_S), daemon.output()  # type: ignore[index]
    eventually(lambda: "pod cache listed" in daemon.output(), daemon)
    return daemon


def gpu_pod(
    apiserver: ApiServerEmulator,
    name: str,
    count: int,
    notes: dict[str, str] | None = None,
    resource: str = GPU,
) -> Any:
    """A pod bound to the node as kube-scheduler binds it (`notes`: what an extender wrote)."""
    limits = {"limits": {resource: str(count)}}
    pod = {
        "metadata": {"name": name, "namespace": "ml", "annotations": notes or {}},
        "spec": {"nodeName": NODE, "containers": [{"name": "cuda", "image": "cuda", "resources": limits}]},
    }
    return apiserver.create("pods", pod)


def admit(kubelet: KubeletEmulator, pod: Any, daemon: Daemon) -> Admission:
    admission = kubelet.admit(pod)
    assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
    return admission


def notes(apiserver: ApiServerEmulator, kind: str, name: str, namespace: str = "") -> dict[str, str]:
    found = apiserver.get(kind, name, namespace) or {}
    return dict(found.get("metadata", {}).get("annotations") or {})


def labels(apiserver: ApiServerEmulator) -> dict[str, str]:
    return dict((apiserver.get("nodes", NODE) or {}).get("metadata", {}).get("labels") or {})


def live_rows(workdir: Path) -> list[tuple[str, str, str, int]]:
    with contextlib.closing(sqlite3.connect(workdir / "state" / "ledger.db")) as db:
        return db.execute(
            "SELECT a.pod_name, a.container, a.resource, g.gpu_index FROM allocations a "
            "JOIN allocation_gpus g USING (pod_uid, container, resource) "
            "WHERE a.state = 'allocated' ORDER BY g.gpu_index"
        ).fetchall()


def test_the_node_advertises_whole_gpus_by_uuid_under_nvidias_resource_and_socket(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = launch(start, apiserver, kubelet, workdir)
    advertised = state(kubelet, GPU)
    assert list(advertised.devices) == UUIDS and advertised.allocatable == 4
    assert advertised.endpoint.endswith("nvidia-gpu.sock")
    assert all(kubelet.resource(name) is None for name in SHARING)
    eventually(lambda: labels(apiserver).get("volcano.sh/gpu-strategy") == "whole", daemon)


def test_a_pod_placed_without_the_extender_gets_the_gpus_kubelet_named_recorded_and_booked(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = launch(start, apiserver, kubelet, workdir)
    admission = admit(kubelet, gpu_pod(apiserver, "trainer", 2), daemon)
    entry = admission.allocation("cuda", GPU)
    # Without a topology the preference is the lowest indices, where the extender books such a pod.
    assert entry.preferred_used and set(entry.device_ids) == set(UUIDS[:2])
    assert entry.envs == {
        "NVIDIA_VISIBLE_DEVICES": ",".join(entry.device_ids),  # kubelet's IDs are the GPUs' UUIDs
        "VOLCANO_GPU_ALLOCATED": "2",
        "VOLCANO_GPU_MEMORY_TOTAL": "40960",
        "VOLCANO_GPU_TOTAL": "40960",
    }
    indices = sorted(UUIDS.index(uuid) for uuid in entry.device_ids)
    assert [row[3] for row in live_rows(workdir)] == indices
    assert {row[:3] for row in live_rows(workdir)} == {("trainer", "cuda", GPU)}
    # The extender books the pod on the GPUs it got.
    wanted = {"volcano.sh/gpu-assigned": "true", "volcano.sh/gpu-index": ",".join(map(str, indices))}
    eventually(lambda: wanted.items() <= notes(apiserver, "pods", "trainer", "ml").items(), daemon)


def test_the_scheduler_s_gpus_are_preferred_and_served(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = launch(start, apiserver, kubelet, workdir)
    placed = {"volcano.sh/gpu-index": "3,1", "volcano.sh/predicate-time": "1"}
    entry = admit(kubelet, gpu_pod(apiserver, "placed", 2, placed), daemon).allocation("cuda", GPU)
    assert entry.preferred_used and set(entry.device_ids) == {UUIDS[3], UUIDS[1]}
    assert set(entry.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == {UUIDS[3], UUIDS[1]}


def test_an_unhealthy_gpu_is_reported_unhealthy_and_kubelet_gives_it_to_nobody(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    events = workdir / "events.jsonl"
    events.touch()
    daemon = launch(start, apiserver, kubelet, workdir, "--fake-gpu-events", str(events))
    inject(events, xid=79, uuid=UUIDS[0])
    eventually(lambda: state(kubelet, GPU).devices[UUIDS[0]] == "Unhealthy", daemon)
    assert state(kubelet, GPU).healthy == tuple(UUIDS[1:])
    eventually(lambda: notes(apiserver, "nodes", NODE).get("volcano.sh/gpu-unhealthy-ids") == "0", daemon)
    entry = admit(kubelet, gpu_pod(apiserver, "after", 3), daemon).allocation("cuda", GPU)
    assert sorted(entry.device_ids) == sorted(UUIDS[1:])
    metrics = urllib.request.urlopen(daemon.metrics_url() + "/metrics", timeout=TIMEOUT_S).read().decode()
    assert f'volcano_gpu_plugin_device_healthy{{devID="{UUIDS[0]}",index="0"}} 0.0' in metrics
    assert f'volcano_gpu_plugin_device_mode{{devID="{UUIDS[1]}",index="1",mode="whole"}} 1.0' in metrics


def test_a_restart_keeps_the_allocation_and_answers_kubelet_again_the_same(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = launch(start, apiserver, kubelet, workdir)
    pod = gpu_pod(apiserver, "kept", 2)
    before = admit(kubelet, pod, daemon).allocation("cuda", GPU).response
    rows = live_rows(workdir)
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait(TIMEOUT_S)
    restarted = launch(start, apiserver, kubelet, workdir)
    assert kubelet.reallocate(pod["metadata"]["uid"], "cuda", GPU) == before
    assert live_rows(workdir) == rows
    eventually(lambda: "pod cache listed" in restarted.output(), restarted)


@pytest.mark.parametrize(("strategy", "resource"), [("whole", GPU), ("number", "volcano.sh/gpu-number")])
def test_without_the_scheduler_s_choice_kubelet_is_steered_to_the_best_linked_gpus(
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    start: Callable[..., Daemon],
    workdir: Path,
    strategy: str,
    resource: str,
) -> None:
    """nvlink-pairs: 0-1 and 2-3 bridged by NVLink, every other pair across the sockets. With GPU 1
    out (unhealthy), two GPUs are 2 and 3 (NV4), not the lowest available indices 0 and 2 (SYS).
    The daemon hands its topology to the number allocator too."""
    events = workdir / "events.jsonl"
    events.touch()
    options = ("--fake-gpu-topology", "nvlink-pairs", "--fake-gpu-events", str(events))
    daemon = launch(start, apiserver, kubelet, workdir, *options, strategy=strategy)
    inject(events, xid=79, uuid=UUIDS[1])
    eventually(lambda: UUIDS[1] not in state(kubelet, resource).healthy, daemon)
    entry = admit(kubelet, gpu_pod(apiserver, "pair", 2, resource=resource), daemon).allocation(
        "cuda", resource
    )
    assert entry.preferred_used and set(entry.device_ids) == {UUIDS[2], UUIDS[3]}


@pytest.mark.parametrize("strategy", ["share", "number", "vgpu"])
def test_a_sharing_node_never_advertises_nvidia_gpus(
    apiserver: ApiServerEmulator,
    kubelet: KubeletEmulator,
    start: Callable[..., Daemon],
    workdir: Path,
    strategy: str,
) -> None:
    """kubelet would count a shared GPU once more as a whole one: only `whole` nodes advertise it."""
    served = [resource.name for resource in RESOURCES[strategy]]  # type: ignore[index]
    hook = workdir / "hook"
    hook.mkdir()
    kubeconfig = apiserver.write_kubeconfig(workdir / "kubeconfig")
    daemon = start(
        *("--fake-gpus", "2x10989", "--gpu-strategy", strategy, "--hook-path", str(hook)),
        *("--kubeconfig", str(kubeconfig)),
    )
    assert kubelet.wait_for(streaming(*served), TIMEOUT_S), daemon.output()
    eventually(lambda: labels(apiserver).get("volcano.sh/gpu-strategy") == strategy, daemon)
    assert sorted(registration.resource for registration in kubelet.registrations) == sorted(served)
    assert kubelet.resource(GPU) is None
    status = (apiserver.get("nodes", NODE) or {}).get("status") or {}
    assert GPU not in {**status.get("capacity", {}), **status.get("allocatable", {})}


def test_a_corrupt_ledger_is_rebuilt_from_kubelets_records(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """The GPUs of a pod placed without the extender come back as kubelet lists them, with the
    response the container got."""
    daemon = launch(start, apiserver, kubelet, workdir)
    pod = gpu_pod(apiserver, "kept", 2)
    before = admit(kubelet, pod, daemon).allocation("cuda", GPU).response
    eventually(
        lambda: notes(apiserver, "pods", "kept", "ml").get("volcano.sh/gpu-assigned") == "true", daemon
    )
    rows = live_rows(workdir)
    assert daemon.stop() == 0
    (workdir / "state" / "ledger.db").write_bytes(b"not a database")
    restarted = launch(start, apiserver, kubelet, workdir)
    assert live_rows(workdir) == rows
    assert kubelet.reallocate(pod["metadata"]["uid"], "cuda", GPU) == before
    eventually(lambda: "ledger rebuilt" in restarted.output(), restarted)
