"""The outbox end to end (issue 13): the daemon as a subprocess, pods in the API-server emulator,
its ledger filled beforehand (as a burst during an API outage leaves it) or by the kubelet
emulator's admissions. The emulator's request log shows what reached the API server; the
daemon's metrics show how the worker drained it."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deviceplugin.ledger import Ledger, Patch
from deviceplugin.plugin.outbox import BATCH
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import NODE, Daemon, eventually
from tests.e2e import test_allocate as alloc
from tests.e2e import test_vgpu as vgpu

NOTE = "example.com/step"


def metric(daemon: Daemon, name: str, **labels: str) -> float:
    return vgpu.samples(daemon, f"volcano_gpu_plugin_{name}").get(tuple(sorted(labels.items())), 0.0)


def backlog(daemon: Daemon) -> float:
    return metric(daemon, "outbox_backlog")


def prefill(workdir: Path, patches: list[Patch]) -> None:
    """Queue `patches` in the ledger the daemon will open, as an earlier run left them."""
    ledger = Ledger(workdir / "state" / "ledger.db")
    ledger.enqueue(patches)
    ledger.close()


def plain_pod(apiserver: ApiServerEmulator, name: str, notes: dict[str, str] | None = None) -> dict[str, Any]:
    return apiserver.create(
        "pods",
        {
            "metadata": {"name": name, "namespace": "ml", "annotations": notes or {}},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "cuda"}]},
        },
    )


def notes_of(apiserver: ApiServerEmulator, name: str) -> dict[str, str]:
    pod = apiserver.get("pods", name, "ml") or {}
    return dict(pod.get("metadata", {}).get("annotations") or {})


def pod_patches(apiserver: ApiServerEmulator, name: str) -> int:
    return apiserver.requests.count(method="PATCH", path=f"/namespaces/ml/pods/{name}")


def test_a_backlog_drains_in_back_to_back_batches(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """Issue 13: the worker waited a second after every batch of 50, so 8,778 entries queued in a
    burst took three minutes to send. A backlog now goes out one full batch after another; the
    worker waits only when nothing is due."""
    count = 3 * BATCH + 7
    names = [plain_pod(apiserver, f"p{n}")["metadata"]["name"] for n in range(count)]
    prefill(workdir, [Patch("pod", "ml", name, {NOTE: "1"}) for name in names])
    daemon = alloc.launch(start, apiserver, kubelet, workdir)
    eventually(lambda: backlog(daemon) == 0, daemon)
    batches = math.ceil(count / BATCH)
    assert metric(daemon, "outbox_batches_total", started_by="backlog") == batches - 1
    assert metric(daemon, "outbox_batches_total", started_by="wait") == 1
    assert metric(daemon, "outbox_entries_total", outcome="sent") == count
    assert all(notes_of(apiserver, name) == {NOTE: "1"} for name in names)


def test_a_pods_entries_go_out_as_one_patch_later_values_winning(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """Issue 13: each entry was its own request. A pod's entries are merged in ledger order (a
    later value, or a removal, wins), sent as one patch, and every one of them is done."""
    for name in ("a", "b"):
        plain_pod(apiserver, name, {"old": "x"})
    unlock = Patch("node", "", NODE, {"gpu": None})
    prefill(
        workdir,
        [
            Patch("pod", "ml", "a", {NOTE: "1", "kept": "a"}),
            Patch("pod", "ml", "b", {NOTE: "1", "old": None}),
            unlock,
            Patch("pod", "ml", "a", {NOTE: "2", "old": None}),
            Patch("pod", "ml", "b", {NOTE: "2", "old": "back"}),
            Patch("pod", "ml", "a", {NOTE: "3"}),
            unlock,
        ],
    )
    daemon = alloc.launch(start, apiserver, kubelet, workdir)
    eventually(lambda: backlog(daemon) == 0, daemon)
    assert notes_of(apiserver, "a") == {NOTE: "3", "kept": "a"}
    assert notes_of(apiserver, "b") == {NOTE: "2", "old": "back"}
    assert (pod_patches(apiserver, "a"), pod_patches(apiserver, "b")) == (1, 1)
    assert metric(daemon, "outbox_entries_total", outcome="sent") == 7


def test_patches_for_a_pod_deleted_while_they_wait_are_dropped_without_a_request(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """Issue 13: the outbox kept sending patches for pods already deleted (each answered 404).
    Once the daemon's pod cache has seen the pod go, its entries are dropped unsent."""
    daemon = alloc.launch(start, apiserver, kubelet, workdir)
    failing = apiserver.faults.error(503, method="PATCH", path="/pods/")
    alloc.admit(kubelet, alloc.make_pod(apiserver, "gone", 10), daemon)
    eventually(lambda: pod_patches(apiserver, "gone") >= 1, daemon)  # refused: it waits for a retry
    apiserver.delete("pods", "gone", "ml")
    eventually(lambda: [row[2] for row in alloc.ledger_rows(workdir)] == ["released"], daemon)
    apiserver.requests.clear()
    apiserver.faults.clear(failing)
    eventually(lambda: backlog(daemon) == 0, daemon)
    assert pod_patches(apiserver, "gone") == 0
    assert metric(daemon, "outbox_entries_total", outcome="pod-gone") == 1


def test_entries_from_before_a_restart_wait_for_the_pod_cache_and_skip_pods_gone_meanwhile(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """Entries an earlier run left: a pod the cache has not listed yet is not taken for gone (its
    entries wait for the list); once listed, those of pods deleted meanwhile, or deleted and
    created again under the same name (another UID), are dropped without a request."""

    def entry(pod: dict[str, Any]) -> Patch:
        meta = pod["metadata"]
        return Patch("pod", "ml", meta["name"], {NOTE: "1"}, meta["uid"])

    alive, deleted, replaced = (plain_pod(apiserver, name) for name in ("alive", "deleted", "again"))
    prefill(workdir, [entry(alive), entry(deleted), entry(replaced), Patch("node", "", NODE, {"gpu": None})])
    for pod in (deleted, replaced):
        apiserver.delete("pods", pod["metadata"]["name"], "ml")
    plain_pod(apiserver, "again")
    no_list = apiserver.faults.error(503, method="GET", path="/pods")
    kubeconfig = apiserver.write_kubeconfig(workdir / "kubeconfig")
    daemon = start("--fake-gpus", "2x10989", "--kubeconfig", str(kubeconfig))
    eventually(lambda: backlog(daemon) == 3, daemon)  # the node's entry went, the pods' wait
    assert apiserver.requests.count(method="PATCH", path="/pods/") == 0
    apiserver.faults.clear(no_list)
    eventually(lambda: backlog(daemon) == 0, daemon)
    assert notes_of(apiserver, "alive") == {NOTE: "1"}
    assert notes_of(apiserver, "again") == {}
    assert (pod_patches(apiserver, "deleted"), pod_patches(apiserver, "again")) == (0, 0)
    assert metric(daemon, "outbox_entries_total", outcome="pod-gone") == 2
