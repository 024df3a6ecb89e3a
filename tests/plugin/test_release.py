"""When the release loop leaves a deleted pod's rows to kubelet's pod-resources check: rows recorded
when pods asking the same count could not be told apart may be another pod's container's."""

from __future__ import annotations

from pathlib import Path

from deviceplugin.plugin.release import Releaser
from deviceplugin.sim.kubelet import KubeletEmulator
from tests.plugin.rig import WAIT_S, Rig, envs, ids


def unconfirmed_row(share: Rig) -> str:
    """Two pods of one size on two GPUs, the first one served with nothing to tell them apart
    (the rig has no pod-resources socket): its row is unconfirmed. Returns its pod's name."""
    share.pod("early", [("cuda", 100)], gpu_index="0", predicate_time=1)
    share.pod("late", [("cuda", 100)], gpu_index="1", predicate_time=2)
    share.allocator.allocate(ids(1, 0, 100))
    (row,) = share.ledger.active()
    assert (row.pod_uid, row.container, row.resource) in share.allocator.unverified()
    return row.pod_name


def delete(share: Rig, name: str) -> None:
    """Delete the pod; once the cache no longer holds it, the release loop has seen the event."""
    uid = share.apiserver.get("pods", name, "ml")["metadata"]["uid"]  # type: ignore[index]
    share.apiserver.delete("pods", name, "ml")
    assert share.pods.wait_until(lambda cache: cache.get(uid) is None, WAIT_S)


def releaser(share: Rig, socket: Path) -> Releaser:
    found = Releaser(share.ledger, share.pods, socket, interval_s=60, grace_s=60)
    found.add_reconciler(share.allocator)
    return found


def test_without_the_socket_a_deletion_releases_at_once(share: Rig, tmp_path: Path) -> None:
    name = unconfirmed_row(share)
    loop = releaser(share, tmp_path / "absent.sock")
    loop.check_with_kubelet()  # List never answers: nothing could ever confirm the row
    delete(share, name)
    assert share.ledger.active() == []


def test_while_list_is_briefly_away_a_deletion_waits_for_it(share: Rig, tmp_path: Path) -> None:
    with KubeletEmulator(tmp_path / "dp", pod_resources_socket=tmp_path / "pr.sock") as kubelet:
        name = unconfirmed_row(share)
        assert kubelet.pod_resources_socket is not None
        loop = releaser(share, kubelet.pod_resources_socket)
        loop.check_with_kubelet()  # List answered: the row is left to it
    loop.check_with_kubelet()  # kubelet away (a restart): List fails for now
    delete(share, name)
    assert [row.pod_name for row in share.ledger.active()] == [name]


def test_without_list_unconfirmed_rows_do_not_pile_up(share: Rig, tmp_path: Path) -> None:
    """Without `List` nothing confirms a row, so every later row stays unconfirmed too: those of
    pods that are gone must not be kept for the daemon's lifetime."""
    name = unconfirmed_row(share)
    loop = releaser(share, tmp_path / "absent.sock")
    loop.check_with_kubelet()
    delete(share, name)
    share.allocator.allocate(ids(0, 0, 100))  # the other pod
    assert share.allocator.unverified() == {
        (row.pod_uid, "cuda", row.resource) for row in share.ledger.active()
    }


def test_a_container_served_again_after_its_release_gets_a_whole_grace_period(
    share: Rig, tmp_path: Path
) -> None:
    """Release -> the same pod's container served again (its UID reused) -> release again: the new
    row is released only after kubelet has not shown it for a whole grace period of its own, not
    at once because the first row was absent that long."""
    now = [0.0]
    with KubeletEmulator(tmp_path / "dp", pod_resources_socket=tmp_path / "pr.sock") as kubelet:
        assert kubelet.pod_resources_socket is not None
        socket = kubelet.pod_resources_socket
        loop = Releaser(share.ledger, share.pods, socket, interval_s=60, grace_s=30, clock=lambda: now[0])
        share.pod("again", [("cuda", 100)], gpu_index="0")
        first = share.allocator.allocate(ids(0, 0, 100))
        loop.check_with_kubelet()  # kubelet lists no such container: absent from now on
        now[0] = 30.0
        loop.check_with_kubelet()
        assert share.ledger.active() == []
        second = share.allocator.allocate(ids(0, 100, 100))  # served again: the row's key is back
        (row,) = share.ledger.active()
        assert (row.pod_name, row.device_ids) == ("again", tuple(ids(0, 100, 100)))
        assert envs(second) == envs(first)
        now[0] = 31.0
        loop.check_with_kubelet()
        assert [r.device_ids for r in share.ledger.active()] == [tuple(ids(0, 100, 100))]
        now[0] = 60.0
        loop.check_with_kubelet()
        assert share.ledger.active() != []
        now[0] = 61.0
        loop.check_with_kubelet()
        assert share.ledger.active() == []
