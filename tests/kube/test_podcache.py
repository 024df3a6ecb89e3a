"""The node-scoped pod cache against the API-server emulator over HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest

from deviceplugin.backoff import Backoff
from deviceplugin.kube.api import ApiError, Kube, Obj, WatchStream, load_client
from deviceplugin.kube.podcache import ListWatchCache, PodCache
from deviceplugin.supervisor import Supervisor
from kubesim.apiserver import ApiServerEmulator
from tests.kube.objects import node_object, pod_object
from tests.kube.waiting import wait_for

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
    # list + watch: the watch request is logged when the emulator takes it, which may come after
    # the list has synced the cache
    assert wait_for(
        lambda: apiserver.requests.count(method="GET", path="fieldSelector=spec.nodeName%3Dnode-a") >= 2
    )


def test_follows_creates_updates_and_deletes(cache: PodCache, apiserver: ApiServerEmulator) -> None:
    pod = apiserver.create("pods", pod_object("later", "node-a"))
    assert cache.wait_until(lambda c: "later" in names(c), WAIT_S)
    apiserver.patch("pods", "later", {"metadata": {"annotations": {"volcano.sh/gpu-index": "1"}}}, "default")

    def annotated(c: PodCache) -> bool:
        seen = c.get(pod["metadata"]["uid"])
        return seen is not None and seen["metadata"].get("annotations", {}).get("volcano.sh/gpu-index") == "1"

    assert cache.wait_until(annotated, WAIT_S)
    as_a_user = kubernetes.client.CoreV1Api(cache.kube.client)
    as_a_user.delete_namespaced_pod("later", "default", grace_period_seconds=0)
    assert cache.wait_until(lambda c: "later" not in names(c), WAIT_S)


def test_waiters_recheck_after_listeners_have_seen_the_change(
    cache: PodCache, apiserver: ApiServerEmulator
) -> None:
    """A waiter may wait on what a listener keeps (Allocate waits on the pending-pod index): it
    must be woken after the listener, not only before it, or it sleeps through the change."""
    seen: list[str] = []
    checks: list[tuple[bool, bool]] = []  # at each look: the cache holds the pod, the listener saw it
    looked = threading.Event()

    def slow_listener(kind: str, pod: Obj) -> None:
        time.sleep(0.3)  # a slow listener (not a synchronisation): a waiter woken early looks meanwhile
        seen.append(pod["metadata"]["name"])

    def listened(c: PodCache) -> bool:
        checks.append(("watched" in names(c), "watched" in seen))
        looked.set()
        return "watched" in seen

    cache.add_listener(slow_listener)
    # The waiter waits before the pod is created (its first look runs under the cache's lock, so
    # the event cannot come between that look and the wait); from then only the cache wakes it.
    waiter = threading.Thread(target=cache.wait_until, args=(listened, WAIT_S))
    waiter.start()
    assert looked.wait(WAIT_S)
    apiserver.create("pods", pod_object("watched", "node-a"))
    waiter.join()
    assert checks[-1] == (True, True)
    assert (True, False) not in checks  # never woken between the cache's change and the listener


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


def test_a_stop_while_the_watch_opens_ends_it_once_it_opens(tmp_path: Path) -> None:
    """A stop that comes while the watch request waits for its answer finds no stream to close;
    the loop must not go on to wait for the watch's first event (a bookmark a minute away on a
    real server, here an hour)."""
    with ApiServerEmulator(bookmark_interval_s=3600) as quiet:
        kube = Kube(load_client(quiet.write_kubeconfig(tmp_path / "kubeconfig")))
        opening = quiet.faults.hang(path="watch=true")
        pods = PodCache(kube, "node-a")
        pods.start()
        assert wait_for(lambda: opening.hits == 1)  # listed; the watch request is held
        stopper = threading.Thread(target=pods.stop)
        stopper.start()
        quiet.faults.clear(opening)  # the watch opens after the stop
        assert wait_for(lambda: not stopper.is_alive())  # long before an event could end the read


def test_a_listener_failing_on_one_pod_costs_only_that_pod(
    cache: PodCache, apiserver: ApiServerEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever a listener raises on one pod (a reader's bug), the cache, the other listeners and
    every other pod go on; the pod is reported once, however often it changes."""
    seen: list[str] = []

    def buggy(kind: str, pod: Obj) -> None:
        if pod["metadata"]["name"] == "poison":
            raise RuntimeError("a bug reading this pod")

    cache.add_listener(buggy)
    cache.add_listener(lambda kind, pod: seen.append(pod["metadata"]["name"]))
    apiserver.create("pods", pod_object("poison", "node-a"))
    apiserver.patch("pods", "poison", {"metadata": {"labels": {"again": "yes"}}}, "default")
    apiserver.create("pods", pod_object("good", "node-a"))
    assert cache.wait_until(lambda c: "good" in seen, WAIT_S)
    assert seen.count("poison") == 2 and names(cache) == {"early", "poison", "good"}
    assert cache.synced and cache.rejections.count == 1 and "worker crashed" not in caplog.text
    (line,) = [r for r in caplog.records if r.getMessage() == "pod rejected"]
    fields = line.fields  # type: ignore[attr-defined]
    assert fields["pod"] == "default/poison" and "RuntimeError" in fields["reason"]
    assert "a bug reading this pod" in fields["reason"]


def only_names(pod: Obj) -> Obj:
    """A projection keeping a pod's name, UID (the cache's key) and node."""
    meta = pod["metadata"]
    if meta["name"] == "unslimmable":
        raise ValueError("cannot slim this pod")
    return {
        "metadata": {"name": meta["name"], "uid": meta["uid"]},
        "spec": {"nodeName": pod["spec"]["nodeName"]},
    }


def test_a_slim_cache_keeps_and_hands_listeners_only_the_projection(
    apiserver: ApiServerEmulator, kube: Kube
) -> None:
    """Listed and watched pods alike are stored and given to listeners as `slim` returns them; the
    deletion reaches listeners, and a pod the projection fails on is reported and costs only itself."""
    apiserver.create("nodes", node_object("node-a"))
    apiserver.create("pods", pod_object("listed", "node-a"))
    pods = PodCache(kube, "node-a", slim=only_names)
    seen: list[tuple[str, Obj]] = []
    pods.add_listener(lambda kind, pod: seen.append((kind, pod)))
    pods.start()
    try:
        assert pods.wait_synced(WAIT_S)
        apiserver.create("pods", pod_object("unslimmable", "node-a"))
        apiserver.create("pods", pod_object("watched", "node-a"))
        assert pods.wait_until(lambda c: "watched" in names(c), WAIT_S)
        apiserver.delete("pods", "watched", "default")
        apiserver.create("pods", pod_object("after", "node-a"))
        assert pods.wait_until(lambda c: names(c) == {"listed", "after"}, WAIT_S)
        served = [apiserver.get("pods", name, "default") or {} for name in ("listed", "after")]
        assert sorted(pods.pods(), key=str) == sorted(map(only_names, served), key=str)
        assert [(kind, pod["metadata"]["name"]) for kind, pod in seen] == [
            ("MODIFIED", "listed"),
            ("ADDED", "watched"),
            ("DELETED", "watched"),
            ("ADDED", "after"),
        ]
        assert all(set(pod) == {"metadata", "spec"} for _, pod in seen)
        assert pods.rejections.count == 1 and pods.synced
        # one list only: every change came through the watch
        assert apiserver.requests.count(method="GET", path="spec.nodeName%3Dnode-a", watch=False) == 1
    finally:
        pods.stop()


def test_an_unexpected_failure_of_the_loop_is_a_supervised_crash_and_it_lists_again(
    apiserver: ApiServerEmulator, kube: Kube
) -> None:
    selector = "spec.nodeName=node-a"
    lists: list[int] = []

    def lister() -> tuple[list[Obj], str]:
        lists.append(1)
        if len(lists) == 1:
            raise RuntimeError("a bug in the list")
        return kube.list_pods(selector)

    apiserver.create("nodes", node_object("node-a"))
    apiserver.create("pods", pod_object("early", "node-a"))
    supervisor = Supervisor(Backoff(start_s=0.001, max_s=0.001))
    pods = ListWatchCache(
        "pod", lister, lambda version, s: kube.watch_pods(selector, version, s), supervisor=supervisor
    )
    pods.start()
    try:
        assert pods.wait_synced(WAIT_S)
        assert len(pods.objects()) == 1 and len(lists) == 2
        assert supervisor.restarts() == {"pod-cache": 1} and supervisor.problems() == []
    finally:
        pods.stop()


def test_staleness_counts_from_the_last_successful_list_even_when_no_watch_follows(
    apiserver: ApiServerEmulator, kube: Kube
) -> None:
    """A list that succeeds is a sync: the cache was current then, though the watch that should
    follow it fails. Staleness counts from it, not from start (it read as never synced)."""
    selector = "spec.nodeName=node-a"
    now = [100.0]
    lists: list[float] = []

    def lister() -> tuple[list[Obj], str]:
        lists.append(now[0])
        if len(lists) > 1:
            raise ApiError(503, "ServiceUnavailable", "the API server is down")
        return kube.list_pods(selector)

    def watcher(version: str, timeout_s: int) -> WatchStream:
        raise ApiError(503, "ServiceUnavailable", "the API server is down")

    apiserver.create("pods", pod_object("early", "node-a"))
    pods = ListWatchCache("pod", lister, watcher, clock=lambda: now[0])
    pods.start()
    try:
        assert wait_for(lambda: len(lists) >= 2)  # listed once, failing since
        now[0] = 107.0
        assert pods.staleness_s() == 7.0 and not pods.synced
        assert len(pods.objects()) == 1
    finally:
        pods.stop()


class Fatal(BaseException):
    """Ends a thread the way nothing in the cache may catch (as SystemExit would)."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_cache_whose_thread_ended_is_not_synced(cache: PodCache, apiserver: ApiServerEmulator) -> None:
    """Readiness reads `synced`: a dead cache must never look current."""

    def fatal(kind: str, pod: Obj) -> None:
        if pod["metadata"]["name"] == "fatal":
            raise Fatal()

    cache.add_listener(fatal)
    apiserver.create("pods", pod_object("fatal", "node-a"))
    assert cache.wait_until(lambda c: not c.synced, WAIT_S)
