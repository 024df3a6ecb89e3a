"""A served pod leaves the candidates Allocate walks as soon as the ledger records its last
container, not when the scheduler's mark of it (`gpu-assigned`) comes back through the watch: the
outbox is not started here, so that mark never comes."""

from __future__ import annotations

from deviceplugin.fit import objects
from tests.kube.waiting import wait_for
from tests.plugin.rig import WAIT_S, Rig, ids


def test_a_pod_leaves_the_candidates_with_its_last_container_and_no_event_brings_it_back(
    share: Rig,
) -> None:
    two = share.pod("two", [("a", 100), ("b", 100)], predicate_time=1)
    share.pod("one", [("c", 100)], predicate_time=2)
    candidates = share.allocator.pending
    assert len(candidates) == 2
    share.allocator.allocate(ids(0, 0, 100))  # two/a
    assert len(candidates) == 2  # two/b is still to come
    share.allocator.allocate(ids(0, 100, 100))  # two/b: the pod is served
    assert len(candidates) == 1
    share.apiserver.patch("pods", "two", {"metadata": {"labels": {"touched": "yes"}}}, "ml")
    assert wait_for(
        lambda: objects.labels_of(share.pods.get(objects.uid(two)) or {}) == {"touched": "yes"}, WAIT_S
    )
    assert len(candidates) == 1  # an event of the served pod does not bring it back
    served = share.allocator.allocate(ids(0, 200, 100))
    assert dict(served.envs)["VOLCANO_GPU_ALLOCATED"] == "100"
    assert sorted((row.pod_name, row.container) for row in share.ledger.active()) == [
        ("one", "c"),
        ("two", "a"),
        ("two", "b"),
    ]
    assert len(candidates) == 0


def test_a_pod_whose_rows_are_released_while_it_waits_is_a_candidate_again(share: Rig) -> None:
    """Rows released while the pod is still bound and unfinished (kubelet stopped listing them):
    its Allocate may come again, and must find it."""
    pod = share.pod("again", [("a", 100), ("b", 100)])
    share.allocator.allocate(ids(0, 0, 100))
    share.allocator.allocate(ids(0, 100, 100))
    assert len(share.allocator.pending) == 0
    assert share.ledger.release_pod(objects.uid(pod), "not in pod-resources") == 2
    assert len(share.allocator.pending) == 1
    share.allocator.allocate(ids(0, 200, 100))
    (row,) = share.ledger.active()
    assert (row.pod_name, row.container, row.device_ids) == ("again", "a", tuple(ids(0, 200, 100)))
