"""The node-scoped pod cache against the API-server emulator over HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from deviceplugin.kube.api import Kube, Obj
from deviceplugin.kube.podcache import PodCache
from deviceplugin.sim.apiserver import ApiServerEmulator
from tests.kube.objects import node_object, pod_object

WAIT_S = 5.0


def names(cache: PodCache) -> set[str]:
    return {pod["metadata"]["name"] for pod in cache.pods()}


@pytest.fixture
def cache(apiserver: ApiServerEmulator, kube: Kube) -> Iterator[PodCache]:
    for node in ("node-a", "node-b"):
        apiserver.create("nodes", node_object(node))
    apiserver.create("pods", pod_object("early", "node-a"))
    apiserver.create("pods", pod_object("elsewhere", "node-b"))
    pods = PodCache(kube, "node-a")
    pods.start()
    assert pods.wait_synced(WAIT_S)
    yield pods
    pods.stop()


def test_lists_only_this_nodes_pods(cache: PodCache, apiserver: ApiServerEmulator) -> None:
    assert names(cache) == {"early"}
    assert cache.synced and cache.staleness_s() == 0.0
    assert (
        apiserver.requests.count(method="GET", path="fieldSelector=spec.nodeName%3Dnode-a") >= 2
    )  # list + watch


def test_follows_creates_updates_and_deletes(cache: PodCache, apiserver: ApiServerEmulator) -> None:
    pod = apiserver.create("pods", pod_object("later", "node-a"))
    assert cache.wait_until(lambda c: "later" in names(c), WAIT_S)
    apiserver.patch("pods", "later", {"metadata": {"annotations": {"volcano.sh/gpu-index": "1"}}}, "default")

    def annotated(c: PodCache) -> bool:
        seen = c.get(pod["metadata"]["uid"])
        return seen is not None and seen["metadata"].get("annotations", {}).get("volcano.sh/gpu-index") == "1"

    assert cache.wait_until(annotated, WAIT_S)
    cache.kube.core.delete_namespaced_pod("later", "default", grace_period_seconds=0)
    assert cache.wait_until(lambda c: "later" not in names(c), WAIT_S)


def test_waiters_recheck_after_listeners_have_seen_the_change(
    cache: PodCache, apiserver: ApiServerEmulator
) -> None:
    """A waiter may wait on what a listener keeps (Allocate waits on the pending-pod index): it
    must be woken after the listener, not only before it, or it sleeps through the change."""
    seen: list[str] = []

    def slow_listener(kind: str, pod: Obj) -> None:
        time.sleep(0.3)
        seen.append(pod["metadata"]["name"])

    cache.add_listener(slow_listener)
    apiserver.create("pods", pod_object("watched", "node-a"))
    began = time.monotonic()
    assert cache.wait_until(lambda _: "watched" in seen, WAIT_S)
    assert time.monotonic() - began < WAIT_S / 2


def test_a_pod_bound_to_this_node_appears_and_others_never_do(
    cache: PodCache, apiserver: ApiServerEmulator
) -> None:
    apiserver.create("pods", pod_object("pending", None))
    apiserver.create("pods", pod_object("other", "node-b"))
    apiserver.bind("default", "pending", "node-a", {"volcano.sh/gpu-index": "0"})
    assert cache.wait_until(lambda c: "pending" in names(c), WAIT_S)
    assert names(cache) == {"early", "pending"}
    assert all(pod["spec"]["nodeName"] == "node-a" for pod in cache.pods())


def test_survives_a_dropped_watch(cache: PodCache, apiserver: ApiServerEmulator) -> None:
    assert apiserver.drop_watches() >= 1
    apiserver.create("pods", pod_object("during-drop", "node-a"))
    assert cache.wait_until(lambda c: "during-drop" in names(c), WAIT_S)
    assert cache.wait_synced(WAIT_S)


def test_relists_after_410(cache: PodCache, apiserver: ApiServerEmulator) -> None:
    lists_before = apiserver.requests.count(method="GET", watch=False, path="pods")
    apiserver.faults.error(503, path="watch=true", times=1)  # the next re-watch fails once...
    apiserver.compact()  # ...and history is gone, so resuming is impossible
    apiserver.drop_watches()
    apiserver.create("pods", pod_object("after-compaction", "node-a"))
    assert cache.wait_until(lambda c: "after-compaction" in names(c), WAIT_S)
    assert apiserver.requests.count(method="GET", watch=False, path="pods") > lists_before


def test_outage_makes_it_stale_then_it_catches_up(cache: PodCache, apiserver: ApiServerEmulator) -> None:
    apiserver.faults.error(503)
    apiserver.drop_watches()
    assert cache.wait_until(lambda c: not c.synced, WAIT_S)
    apiserver.create("pods", pod_object("in-outage", "node-a"))
    first = cache.staleness_s()
    assert cache.wait_until(lambda c: c.staleness_s() > first, WAIT_S)
    assert "in-outage" not in names(cache)
    apiserver.faults.clear()
    assert cache.wait_until(lambda c: "in-outage" in names(c) and c.synced, 15)
    assert cache.staleness_s() == 0.0


def test_stop_ends_a_blocked_watch_promptly(apiserver: ApiServerEmulator, kube: Kube) -> None:
    pods = PodCache(kube, "node-a")
    pods.start()
    assert pods.wait_synced(WAIT_S)
    pods.stop()
    assert not pods.synced
