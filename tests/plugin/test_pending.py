"""Serving order of the pending pods: kubelet's admission order as the daemon's watch shows it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceplugin.kube.rejections import Rejections
from deviceplugin.plugin.gpushare import GpusharePod, read_gpushare_pod
from deviceplugin.plugin.pending import PendingPods, asks_for

MEM = "volcano.sh/gpu-memory"


def pod(name: str, created: str, predicate_time: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "annotations": {"volcano.sh/gpu-index": "0", "volcano.sh/predicate-time": str(predicate_time)},
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "resources": {"limits": {MEM: "10"}}}]},
        "status": {"phase": "Pending"},
    }


def order(pending: PendingPods[GpusharePod]) -> list[str]:
    return [candidate.name for candidate, _ in pending.matching(frozenset(), 10)]


def pending(rejections: Rejections | None = None) -> PendingPods[GpusharePod]:
    return PendingPods(lambda obj: read_gpushare_pod(obj, MEM), rejections or Rejections("pod"))


def with_predicate_time(obj: dict[str, Any], value: str) -> dict[str, Any]:
    obj["metadata"]["annotations"]["volcano.sh/predicate-time"] = value
    return obj


def test_watched_bindings_keep_their_order_whatever_the_scheduler_times_say() -> None:
    index = pending()
    index.on_pod("ADDED", pod("b", "2024-05-01T10:00:05Z", 300))
    index.on_pod("ADDED", pod("a", "2024-05-01T10:00:00Z", 100))
    index.on_pod("MODIFIED", pod("b", "2024-05-01T10:00:05Z", 300))  # an update keeps its place
    assert order(index) == ["b", "a"]


def test_a_list_is_one_group_in_creation_then_scheduler_order() -> None:
    """Pods first seen in a list (daemon start, relist) were bound in an order nobody can tell:
    kubelet's own batch after a restart goes by creation time."""
    index = pending()
    index.on_pod("ADDED", pod("watched", "2024-05-01T10:00:09Z", 900))
    for listed in (
        pod("late", "2024-05-01T10:00:02Z", 1),
        pod("tie-later", "2024-05-01T10:00:01Z", 50),
        pod("tie-earlier", "2024-05-01T10:00:01Z", 40),
    ):
        index.on_pod("MODIFIED", listed)
    index.on_pod("ADDED", pod("after", "2024-05-01T10:00:00Z", 0))
    assert order(index) == ["watched", "tie-earlier", "tie-later", "late", "after"]


def test_a_pod_that_leaves_and_is_seen_again_counts_as_new() -> None:
    index = pending()
    index.on_pod("ADDED", pod("a", "2024-05-01T10:00:00Z", 1))
    index.on_pod("ADDED", pod("b", "2024-05-01T10:00:00Z", 2))
    index.on_pod("DELETED", pod("a", "2024-05-01T10:00:00Z", 1))
    index.on_pod("ADDED", pod("a", "2024-05-01T10:00:00Z", 1))
    assert order(index) == ["b", "a"]


def test_a_pod_the_reader_fails_on_is_left_out_alone_and_reported_once() -> None:
    """Whatever the reader raises (a bug included): that pod is no candidate, the others are."""
    rejections = Rejections("pod")

    def reader(obj: Mapping[str, Any]) -> GpusharePod | None:
        if obj["metadata"]["annotations"]["volcano.sh/predicate-time"] == "bug":
            raise RuntimeError("a bug in the reader")
        return read_gpushare_pod(obj, MEM)

    index = PendingPods(reader, rejections)
    broken = with_predicate_time(pod("broken", "2024-05-01T10:00:00Z", 0), "bug")
    index.on_pod("ADDED", broken)
    index.on_pod("MODIFIED", broken)  # a status update: not reported again
    index.on_pod("ADDED", pod("good", "2024-05-01T10:00:01Z", 2))
    assert order(index) == ["good"] and rejections.count == 1
    index.on_pod("MODIFIED", pod("broken", "2024-05-01T10:00:00Z", 1))  # fixed: keeps its arrival
    assert order(index) == ["broken", "good"]


def test_a_pod_with_a_problem_stays_a_candidate_and_is_reported() -> None:
    """Its Allocate answers with the problem instead of waiting for a pod that never comes."""
    rejections = Rejections("pod")
    index = pending(rejections)
    index.on_pod("ADDED", with_predicate_time(pod("odd", "2024-05-01T10:00:00Z", 0), "soon"))
    assert order(index) == ["odd"] and rejections.count == 1


def test_asks_for() -> None:
    assert asks_for(pod("gpu", "2024-05-01T10:00:00Z", 1), [MEM])
    assert not asks_for(pod("gpu", "2024-05-01T10:00:00Z", 1), ["volcano.sh/gpu-number"])
    assert not asks_for({"spec": {"containers": "not a list"}}, [MEM])
