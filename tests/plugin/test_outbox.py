"""The outbox worker against the API-server emulator: what it writes, what it retries, what it
drops, and how few requests a burst of Allocates costs. (Draining, merging and dropping through
the daemon: tests/e2e/test_outbox.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin.kube.api import Kube
from deviceplugin.kube.podcache import PodCache
from deviceplugin.ledger import Ledger, Patch
from deviceplugin.plugin.outbox import BATCH, OutboxWorker
from kubesim.apiserver import ApiServerEmulator
from tests.daemons import eventually
from tests.kube.objects import node_object, pod_object

LOCK = "gpu"  # Volcano's gpushare node lock


def assigned(name: str) -> Patch:
    return Patch("pod", "default", name, {"volcano.sh/gpu-assigned": "true"})


def unlock(node: str = "n") -> Patch:
    return Patch("node", "", node, {LOCK: None})


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.db")


@pytest.fixture
def pods(kube: Kube) -> Iterator[PodCache]:
    cache = PodCache(kube, "n")
    cache.start()
    assert cache.wait_synced(10)
    yield cache
    cache.stop()


@pytest.fixture
def worker(ledger: Ledger, kube: Kube, pods: PodCache, apiserver: ApiServerEmulator) -> OutboxWorker:
    node = node_object("n")
    node["metadata"]["annotations"] = {LOCK: "2026-11-21T10:00:00Z", "keep": "1"}
    apiserver.create("nodes", node)
    return OutboxWorker(ledger, kube, pods)


def notes(apiserver: ApiServerEmulator, plural: str, name: str, namespace: str = "") -> dict[str, str]:
    obj = apiserver.get(plural, name, namespace)
    assert obj is not None
    return dict(obj["metadata"].get("annotations") or {})


def test_a_burst_costs_one_lock_release_and_one_patch_per_pod(
    worker: OutboxWorker, ledger: Ledger, apiserver: ApiServerEmulator
) -> None:
    for n in range(5):
        apiserver.create("pods", pod_object(f"p{n}", "n"))
        ledger.enqueue([assigned(f"p{n}"), unlock()])
    apiserver.requests.clear()
    worker.run_once()
    assert ledger.outbox_size() == 0
    assert apiserver.requests.count(method="PATCH", path="/nodes/n") == 1
    assert apiserver.requests.count(method="PATCH", path="/pods/") == 5
    assert notes(apiserver, "nodes", "n") == {"keep": "1"}
    assert all(notes(apiserver, "pods", f"p{n}", "default") for n in range(5))


def test_an_absent_lock_is_done_without_a_write(
    worker: OutboxWorker, ledger: Ledger, apiserver: ApiServerEmulator
) -> None:
    ledger.enqueue([unlock()])
    worker.run_once()
    before = apiserver.get("nodes", "n")
    ledger.enqueue([unlock()])
    worker.run_once()
    assert ledger.outbox_size() == 0
    assert apiserver.get("nodes", "n") == before  # same resourceVersion: no new node version


def test_a_pod_that_is_gone_is_dropped(worker: OutboxWorker, ledger: Ledger) -> None:
    ledger.enqueue([assigned("never-existed")])
    worker.run_once()
    assert ledger.outbox_size() == 0
    assert worker.entries == {"refused": 1}


def test_a_pod_the_cache_has_not_seen_is_not_taken_for_gone(
    worker: OutboxWorker, ledger: Ledger, apiserver: ApiServerEmulator
) -> None:
    """Absent from the (synced) cache but never seen deleted there: the patch is sent."""
    elsewhere = apiserver.create("pods", pod_object("elsewhere", "other-node"))  # never in this cache
    ledger.enqueue([Patch("pod", "default", "elsewhere", {"a": "1"}, elsewhere["metadata"]["uid"])])
    worker.run_once()
    assert notes(apiserver, "pods", "elsewhere", "default") == {"a": "1"}
    assert worker.entries == {"sent": 1}


def test_server_errors_are_retried_with_backoff_and_survive_a_restart(
    worker: OutboxWorker,
    ledger: Ledger,
    kube: Kube,
    pods: PodCache,
    apiserver: ApiServerEmulator,
    tmp_path: Path,
) -> None:
    apiserver.create("pods", pod_object("p", "n"))
    ledger.enqueue([assigned("p")])
    apiserver.faults.error(503, method="PATCH")
    worker.run_once()
    assert ledger.outbox_size() == 1
    assert ledger.due() == []  # waiting out its back-off
    apiserver.faults.clear()
    ledger.close()

    reopened = Ledger(tmp_path / "ledger.db", clock=lambda: 1e12)  # long after the back-off
    (entry,) = reopened.due()
    assert entry.attempts == 1
    OutboxWorker(reopened, kube, pods).run_once()
    assert reopened.outbox_size() == 0
    assert notes(apiserver, "pods", "p", "default") == {"volcano.sh/gpu-assigned": "true"}


def test_the_worker_thread_applies_what_it_is_woken_for(
    worker: OutboxWorker, ledger: Ledger, apiserver: ApiServerEmulator
) -> None:
    apiserver.create("pods", pod_object("p", "n"))
    worker.start()
    try:
        ledger.enqueue([assigned("p"), unlock()])
        worker.wake()
        eventually(lambda: notes(apiserver, "nodes", "n") == {"keep": "1"})
    finally:
        worker.stop()
    assert ledger.outbox_size() == 0


def pod_patches(apiserver: ApiServerEmulator, name: str) -> int:
    return sum(
        1 for r in apiserver.requests.records() if r.method == "PATCH" and r.path.endswith(f"/pods/{name}")
    )


def test_a_pods_queued_patches_go_out_as_one_patch_applied_in_queue_order(
    worker: OutboxWorker, ledger: Ledger, apiserver: ApiServerEmulator
) -> None:
    """Patches queued one by one (as Allocates queue them), interleaved with another pod's and
    split by more pods than a pass takes: each pod gets one PATCH holding all of its patches, a
    later value or removal winning, and every row is done once (a second pass sends nothing)."""
    for name, notes_now in (("solo", {"old": "x", "drop": "1"}), ("other", {})):
        pod = pod_object(name, "n")
        pod["metadata"]["annotations"] = notes_now
        apiserver.create("pods", pod)
    fillers = [f"f{n}" for n in range(BATCH)]
    for name in fillers:
        apiserver.create("pods", pod_object(name, "n"))
    queued = [
        Patch("pod", "default", "solo", {"a": "1", "c": None}),
        Patch("pod", "default", "other", {"a": "other"}),
        Patch("pod", "default", "solo", {"drop": None, "a": None}),
        *[assigned(name) for name in fillers],  # the pass's other pods: the next patches come after
        Patch("pod", "default", "solo", {"a": "2", "c": "3"}),
        Patch("pod", "default", "other", {"b": "other"}),
    ]
    for patch in queued:
        ledger.enqueue([patch])
    apiserver.requests.clear()
    worker.run_once()
    assert notes(apiserver, "pods", "solo", "default") == {"old": "x", "a": "2", "c": "3"}
    assert notes(apiserver, "pods", "other", "default") == {"a": "other", "b": "other"}
    assert (pod_patches(apiserver, "solo"), pod_patches(apiserver, "other")) == (1, 1)

    for _ in range(3):  # the fillers left over, then a pass that finds nothing left
        worker.run_once()
    assert ledger.outbox_size() == 0
    assert worker.entries == {"sent": len(queued)}
    assert apiserver.requests.count(method="PATCH") == 2 + BATCH


def test_a_failed_coalesced_patch_keeps_every_row_and_retries_them_as_one(
    kube: Kube, pods: PodCache, apiserver: ApiServerEmulator, tmp_path: Path
) -> None:
    now = [1000.0]
    ledger = Ledger(tmp_path / "clocked.db", clock=lambda: now[0])
    worker = OutboxWorker(ledger, kube, pods)
    apiserver.create("pods", pod_object("p", "n"))
    for value in ("1", "2", "3"):
        ledger.enqueue([Patch("pod", "default", "p", {"a": value, f"k{value}": value})])
    apiserver.faults.error(503, method="PATCH", times=1)
    worker.run_once()
    assert [entry.attempts for entry in ledger.due(hold_pods_through=0)] == []  # all backing off
    assert ledger.outbox_size() == 3

    now[0] += 3600  # past the back-off
    assert [entry.attempts for entry in ledger.due()] == [1, 1, 1]
    apiserver.requests.clear()
    worker.run_once()
    assert notes(apiserver, "pods", "p", "default") == {"a": "3", "k1": "1", "k2": "2", "k3": "3"}
    assert pod_patches(apiserver, "p") == 1
    assert ledger.outbox_size() == 0
    assert worker.entries == {"retried": 3, "sent": 3}
