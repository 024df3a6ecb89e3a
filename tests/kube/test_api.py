"""The API facade against the emulator: JSON in and out, error classes, retries, preconditions."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import urllib3

from deviceplugin.kube.api import ApiError, Kube, Obj, retry
from kubesim.apiserver import ApiServerEmulator
from tests.kube.objects import node_object, pod_object
from tests.kube.waiting import WAIT_S, wait_for


def test_pod_annotation_patch_merges_and_removes(apiserver: ApiServerEmulator, kube: Kube) -> None:
    apiserver.create("pods", pod_object("p", "node-a"))
    kube.patch_pod_annotations("default", "p", {"volcano.sh/gpu-assigned": "false", "keep": "1"})
    kube.patch_pod_annotations("default", "p", {"volcano.sh/gpu-assigned": "true", "keep": None})
    assert kube.get_pod("default", "p")["metadata"]["annotations"] == {"volcano.sh/gpu-assigned": "true"}


def test_resource_version_precondition(apiserver: ApiServerEmulator, kube: Kube) -> None:
    created = apiserver.create("pods", pod_object("p", "node-a"))
    version = created["metadata"]["resourceVersion"]
    kube.patch_pod_annotations("default", "p", {"a": "1"}, resource_version=version)
    with pytest.raises(ApiError) as caught:
        kube.patch_pod_annotations("default", "p", {"b": "2"}, resource_version=version)  # now stale
    assert caught.value.conflict and caught.value.reason == "Conflict"
    assert "b" not in kube.get_pod("default", "p")["metadata"]["annotations"]


def test_node_annotation_removal_writes_only_when_the_key_is_there(
    apiserver: ApiServerEmulator, kube: Kube
) -> None:
    node = node_object("n")
    node["metadata"]["annotations"] = {"gpu": "locked", "a/b~c": "odd key", "keep": "1"}
    apiserver.create("nodes", node)
    assert kube.remove_node_annotation("n", "gpu")
    assert kube.remove_node_annotation("n", "a/b~c")  # "/" and "~" are escaped in the JSON pointer
    after = apiserver.get("nodes", "n")
    assert after is not None and after["metadata"]["annotations"] == {"keep": "1"}
    assert not kube.remove_node_annotation("n", "gpu")  # the server's 422: already absent
    assert apiserver.get("nodes", "n") == after  # nothing written, not even a new resourceVersion
    assert kube.errors == {}  # absent is the outcome wanted, not a failed call


def test_a_node_lock_removal_that_fails_otherwise_raises_and_is_counted(
    apiserver: ApiServerEmulator, kube: Kube
) -> None:
    with pytest.raises(ApiError) as caught:
        kube.remove_node_annotation("missing", "gpu")
    assert caught.value.status == 404
    apiserver.create("nodes", node_object("n"))
    apiserver.faults.error(422, method="PATCH", path="/nodes/n", times=1)  # as 422 but on another call
    with pytest.raises(ApiError):
        kube.patch_node("n", {"metadata": {"annotations": {"a": "1"}}})
    assert kube.errors == {("patch_node", 404): 1, ("patch_node", 422): 1}


def test_retry_refreshes_on_conflict(apiserver: ApiServerEmulator, kube: Kube) -> None:
    apiserver.create("pods", pod_object("p", "node-a"))
    seen = {"version": "1"}  # stale on purpose

    def refresh() -> None:
        seen["version"] = kube.get_pod("default", "p")["metadata"]["resourceVersion"]

    retry(
        lambda: kube.patch_pod_annotations("default", "p", {"x": "y"}, resource_version=seen["version"]),
        "patch pod",
        deadline_s=5,
        on_conflict=refresh,
    )
    assert kube.get_pod("default", "p")["metadata"]["annotations"]["x"] == "y"


def test_transient_errors_are_retried_and_others_are_not(apiserver: ApiServerEmulator, kube: Kube) -> None:
    apiserver.create("nodes", node_object("node-a"))
    apiserver.faults.error(503, times=2)
    assert retry(lambda: kube.get_node("node-a"), "get node", deadline_s=5)["metadata"]["name"] == "node-a"
    with pytest.raises(ApiError) as caught:
        retry(lambda: kube.get_node("missing"), "get node", deadline_s=5)
    assert (caught.value.status, caught.value.reason, caught.value.transient) == (404, "NotFound", False)
    assert apiserver.requests.count(path="/nodes/missing") == 1


def test_deadline_bounds_the_retries(apiserver: ApiServerEmulator, kube: Kube) -> None:
    apiserver.faults.error(503)
    with pytest.raises(ApiError) as caught:
        retry(lambda: kube.get_node("node-a"), "get node", deadline_s=0.5)
    assert caught.value.transient


def test_no_answer_is_transient(apiserver: ApiServerEmulator, kube: Kube) -> None:
    kube.timeout = urllib3.Timeout(connect=1.0, read=0.3)
    apiserver.faults.hang()
    with pytest.raises(ApiError) as caught:
        kube.get_node("node-a")
    assert caught.value.status == 0 and caught.value.transient
    apiserver.faults.clear()


def _recording(errors: list[BaseException], action: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        try:
            action()
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _closed_by_four(kube: Kube, after_first_event: bool) -> str:
    """Open a watch, read it in one thread and close it from four: what went wrong, if anything."""
    stream = kube.watch_pods("", "0", 60)
    events: list[Obj] = []
    raised: list[BaseException] = []

    def read() -> None:
        for event in stream:
            events.append(event)

    reader = _recording(raised, read)
    if after_first_event:  # mid-stream; else the close may land before the first byte
        assert wait_for(lambda: len(events) > 0)
    for closer in [_recording(raised, stream.close) for _ in range(4)]:
        closer.join()
    reader.join(WAIT_S)
    if reader.is_alive():
        return "the reader is still blocked"
    return f"after {len(events)} events: {raised!r}" if raised else ""


def test_a_watch_closed_from_other_threads_mid_read_just_ends(
    apiserver: ApiServerEmulator, kube: Kube
) -> None:
    # The pod cache stops its watch by closing it from the stopping thread while its own thread
    # reads. Each round closes, from four threads at once, a watch streaming a backlog of 300 pods
    # (600 kB): the close lands in a blocked read, in a chunk read or between them. The reader must
    # see the stream end, never an error: an ApiError reads as a lost API server, and the
    # AttributeError a torn-down response raised killed the cache's thread.
    for i in range(300):
        pod = pod_object(f"p{i}", "node-a")
        pod["metadata"]["annotations"] = {"padding": "x" * 2000}
        apiserver.create("pods", pod)
    for round_ in range(60):
        assert _closed_by_four(kube, after_first_event=round_ % 2 == 1) == "", f"round {round_}"


def test_a_failed_watch_is_counted_under_the_watch_it_was(apiserver: ApiServerEmulator, kube: Kube) -> None:
    """The API error metric names the call: a failing node watch is no pod watch."""
    apiserver.faults.error(503, method="GET", path="/nodes?", times=1)
    apiserver.faults.error(410, method="GET", path="/pods?", times=1)
    for watch in (kube.watch_nodes, kube.watch_pods):
        with pytest.raises(ApiError):
            watch("", "1", 60)
    assert kube.errors == {("watch_nodes", 503): 1, ("watch_pods", 410): 1}
