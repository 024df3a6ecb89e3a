"""When the release loop leaves a deleted pod's rows to kubelet's pod-resources check: rows recorded
when pods asking the same count could not be told apart may be another pod's container's."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from deviceplugin.kube.podcache import PodCache
from deviceplugin.ledger import Allocation, GpuShare, Key, Ledger
from deviceplugin.plugin.podresources import Listing
from deviceplugin.plugin.recover import rebuild_ledger
from deviceplugin.plugin.release import Reconciler, Releaser
from deviceplugin.supervisor import Supervisor
from kubesim.kubelet import KubeletEmulator
from tests.daemons import eventually
from tests.disks import tmpfs
from tests.plugin.rig import MEM, NODE, WAIT_S, Rig, envs, ids
from tests.sim.test_kubelet import device
from tests.sim.test_kubelet_admission import Plugins, container
from tests.sim.test_kubelet_admission import pod as kube_pod


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


def test_while_list_is_briefly_away_a_deletion_waits_for_it(
    share: Rig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin.plugin.release")
    with KubeletEmulator(tmp_path / "dp", pod_resources_socket=tmp_path / "pr.sock") as kubelet:
        name = unconfirmed_row(share)
        assert kubelet.pod_resources_socket is not None
        loop = releaser(share, kubelet.pod_resources_socket)
        loop.check_with_kubelet()  # List answered: the row is left to it
    loop.check_with_kubelet()  # kubelet away (a restart): List fails for now
    (row,) = share.ledger.active()
    delete(share, name)
    assert [row.pod_name for row in share.ledger.active()] == [name]
    (line,) = [r for r in caplog.records if r.getMessage() == "release left to the pod-resources check"]
    assert line.__dict__["fields"] == {"pod_uid": row.pod_uid, "reason": "pod deleted"}


def test_while_list_is_over_kubelets_rate_limit_a_deletion_waits_for_it(share: Rig, tmp_path: Path) -> None:
    """A first `List` refused as over kubelet's rate limit (it may be, while kubelet admits pods)
    still shows kubelet there: the row waits for the check rather than going as if no kubelet
    ever answered (a pod served as another that was then deleted lost its row so)."""
    limited = KubeletEmulator(
        tmp_path / "dp",
        pod_resources_socket=tmp_path / "pr.sock",
        pod_resources_qps=0.0,
        pod_resources_burst=0,
    )
    with limited as kubelet:
        name = unconfirmed_row(share)
        assert kubelet.pod_resources_socket is not None
        loop = releaser(share, kubelet.pod_resources_socket)
        loop.check_with_kubelet()
        assert kubelet.pod_resources_calls.rejected == 1  # refused, not unanswered
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


# --- what frees rows, and why (the reason is the ledger's "ledger released" line) ----------------


def released(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """(pod UID, reason) of each release the ledger logged."""
    lines = [
        r for r in caplog.records if r.name == "deviceplugin.ledger" and r.getMessage() == "ledger released"
    ]
    return [(r.__dict__["fields"]["pod_uid"], r.__dict__["fields"]["reason"]) for r in lines]


def served(share: Rig, name: str, gpu: int) -> str:
    """A pod of 100 MiB on `gpu`, served; its UID."""
    uid: str = share.pod(name, [("cuda", 100)], gpu_index=str(gpu))["metadata"]["uid"]
    share.allocator.allocate(ids(gpu, 0, 100))
    return uid


def test_a_deleted_or_finished_pods_rows_go_at_once_with_the_reason(
    share: Rig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin.ledger")
    freed: list[str] = []
    Releaser(
        share.ledger, share.pods, tmp_path / "none.sock", interval_s=60, grace_s=60, on_released=freed.append
    )
    deleted, failed, running = (
        served(share, "deleted", 0),
        served(share, "failed", 1),
        served(share, "running", 2),
    )
    share.apiserver.patch("pods", "running", {"status": {"phase": "Running"}}, "ml", subresource="status")
    share.apiserver.patch("pods", "failed", {"status": {"phase": "Failed"}}, "ml", subresource="status")
    share.apiserver.delete("pods", "deleted", "ml")
    eventually(lambda: len(share.ledger.active()) == 1)
    assert [row.pod_uid for row in share.ledger.active()] == [running]
    assert sorted(released(caplog)) == sorted([(deleted, "pod deleted"), (failed, "pod Failed")])
    assert sorted(freed) == sorted([deleted, failed])


def test_rows_of_pods_gone_while_nobody_watched_go_once_the_cache_has_listed(
    share: Rig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin.ledger")
    gone, kept = served(share, "gone", 0), served(share, "kept", 1)
    delete(share, "gone")  # before any release loop listened
    unsynced = PodCache(share.kube, NODE)  # not started: it has not listed
    for pods in (None, unsynced):
        Releaser(share.ledger, pods, tmp_path / "none.sock", interval_s=60, grace_s=60).release_missing_pods()
    assert len(share.ledger.active()) == 2  # nothing to compare with: nothing goes
    Releaser(
        share.ledger, share.pods, tmp_path / "none.sock", interval_s=60, grace_s=60
    ).release_missing_pods()
    assert [row.pod_uid for row in share.ledger.active()] == [kept]
    assert released(caplog) == [(gone, "pod no longer on the node")]


def test_rows_kubelet_shows_stay_and_the_others_go_after_the_grace(
    share: Rig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A row stays while kubelet lists its container; it goes once kubelet has not for the grace
    period, with the reason; a listed row before it does not stop the check of the others."""
    caplog.set_level(logging.INFO, logger="deviceplugin.ledger")
    listed, unlisted = served(share, "listed", 0), served(share, "unlisted", 1)
    now = [0.0]
    with KubeletEmulator(tmp_path / "dp", pod_resources_socket=tmp_path / "pr.sock") as kubelet:
        assert kubelet.pod_resources_socket is not None
        assert kubelet.admit(kube_pod("listed", [container("cuda")], namespace="ml")).admitted
        loop = Releaser(
            share.ledger,
            share.pods,
            kubelet.pod_resources_socket,
            interval_s=60,
            grace_s=30,
            clock=lambda: now[0],
        )
        loop.check_with_kubelet()
        now[0] = 29.0
        loop.check_with_kubelet()
        assert len(share.ledger.active()) == 2
        now[0] = 30.0
        loop.check_with_kubelet()
    assert [row.pod_uid for row in share.ledger.active()] == [listed]
    assert released(caplog) == [(unlisted, "container cuda not in pod-resources")]


def test_pod_resources_unavailable_is_warned_once_until_it_answers_again(
    share: Rig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="deviceplugin.plugin.release")
    socket = tmp_path / "pr.sock"
    loop = Releaser(share.ledger, share.pods, socket, interval_s=60, grace_s=60)
    loop.check_with_kubelet()
    loop.check_with_kubelet()
    with KubeletEmulator(tmp_path / "dp", pod_resources_socket=socket):
        loop.check_with_kubelet()
    loop.check_with_kubelet()
    lines = [r for r in caplog.records if r.name == "deviceplugin.plugin.release"]
    fields = {"socket": str(socket), "error": "UNAVAILABLE"}
    assert [(r.getMessage(), r.__dict__["fields"]) for r in lines] == [
        ("pod-resources unavailable", fields)
    ] * 2


def test_a_full_disk_puts_a_release_off_until_it_can_be_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="deviceplugin.plugin.release")
    with tmpfs(tmp_path / "disk") as disk:
        ledger = Ledger(disk.path / "ledger.db")
        ledger.record(
            Allocation("uid-a", "ml", "a", "cuda", MEM, (GpuShare("GPU-000", 0, 100),), ("0-0",), b"")
        )
        freed: list[str] = []
        loop = Releaser(
            ledger, None, tmp_path / "none.sock", interval_s=60, grace_s=60, on_released=freed.append
        )
        disk.fill()
        gone = {"metadata": {"uid": "uid-a", "name": "a", "namespace": "ml"}}
        loop.on_pod("DELETED", gone)
        assert len(ledger.active()) == 1 and freed == []
        disk.free()
        loop.on_pod("DELETED", gone)
        assert ledger.active() == [] and freed == ["uid-a"]
        ledger.close()
    (line,) = [r for r in caplog.records if r.name == "deviceplugin.plugin.release"]
    assert line.getMessage() == "release put off: the ledger cannot be written"
    assert line.__dict__["fields"] == {"pod_uid": "uid-a", "reason": "pod deleted"}


def test_the_loop_releases_rows_of_pods_gone_unseen_until_stopped(share: Rig, tmp_path: Path) -> None:
    """Each pass of the loop (every interval) looks for rows whose pod the cache no longer holds."""
    gone, kept = served(share, "gone", 0), served(share, "kept", 1)
    delete(share, "gone")
    loop = Releaser(share.ledger, share.pods, tmp_path / "none.sock", interval_s=0.05, grace_s=60)
    loop.start()
    try:
        eventually(lambda: [row.pod_uid for row in share.ledger.active()] == [kept])
    finally:
        loop.stop()
    assert "release" not in {thread.name for thread in threading.enumerate()}
    assert gone not in {row.pod_uid for row in share.ledger.active()}


def test_a_replaced_ledger_is_rebuilt_once_from_the_first_list_with_the_cache_synced(
    share: Rig, tmp_path: Path
) -> None:
    """Tried at start, before the daemon registers with kubelet, and by each pass until kubelet
    answers with the pod cache synced; then never again."""
    reports: list[str] = []
    socket = tmp_path / "pr.sock"

    def rebuild(listing: Listing, allocators: Sequence[Reconciler]) -> object:
        return rebuild_ledger(tmp_path / "ledger.db.corrupt", listing, allocators, reports.append)

    unsynced = Releaser(
        share.ledger, PodCache(share.kube, NODE), socket, interval_s=60, grace_s=60, rebuild=rebuild
    )
    loop = Releaser(share.ledger, share.pods, socket, interval_s=60, grace_s=60, rebuild=rebuild)
    loop.add_reconciler(share.allocator)
    loop.check_with_kubelet()  # kubelet does not answer yet
    with KubeletEmulator(tmp_path / "dp", pod_resources_socket=socket):
        unsynced.check_with_kubelet()  # kubelet answers, but which pods are bound here is not known
        assert reports == []
        loop.start()
        try:
            assert len(reports) == 1 and "0 allocation(s) rebuilt" in reports[0]  # done before start returned
            loop.check_with_kubelet()
        finally:
            loop.stop()
    assert len(reports) == 1


def test_a_failed_correction_does_not_stop_the_release_of_unlisted_rows(
    share: Rig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reconciler that raises (a bug: the allocators' own faults are storage errors, caught
    inside) is logged with the error, and each pass still releases what kubelet does not show."""
    served(share, "unlisted", 0)
    now = [0.0]

    class Broken:
        def reconcile(self, listing: Listing) -> int:
            raise RuntimeError("correction failed")

        def unverified(self) -> frozenset[Key]:
            return frozenset()

        def rebuild(self, listing: Listing) -> tuple[list[Allocation], list[str]]:
            return [], []

    with KubeletEmulator(tmp_path / "dp", pod_resources_socket=tmp_path / "pr.sock") as kubelet:
        assert kubelet.pod_resources_socket is not None
        loop = Releaser(
            share.ledger,
            share.pods,
            kubelet.pod_resources_socket,
            interval_s=60,
            grace_s=1,
            clock=lambda: now[0],
        )
        loop.add_reconciler(Broken())
        loop.check_with_kubelet()
        now[0] = 1.0
        loop.check_with_kubelet()
    assert share.ledger.active() == []
    lines = [r for r in caplog.records if r.getMessage() == "reconcile failed"]
    assert [r.__dict__["fields"] for r in lines] == [{"error": "RuntimeError('correction failed')"}] * 2


# --- what kubelet's records keep ------------------------------------------------------------------


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[KubeletEmulator]:
    with KubeletEmulator(tmp_path / "dp", pod_resources_socket=tmp_path / "pr.sock") as emulator:
        yield emulator


def listing_pod(kubelet: KubeletEmulator, name: str, *containers: str) -> None:
    """Kubelet admitted a pod of this name whose containers hold no device."""
    assert kubelet.admit(kube_pod(name, [container(c) for c in containers], namespace="ml")).admitted


def holding_gpu_1(kubelet: KubeletEmulator, name: str) -> Iterator[None]:
    """Kubelet gave gpu-memory devices 1-0..1-99 to container `cuda` of pod `name` (a plugin of
    its own serves those IDs and prefers the lowest)."""
    plugins = Plugins(kubelet)
    plugin = plugins.serve([device(f"1-{n}") for n in range(100)], MEM)
    plugin.answer = lambda request: [f"1-{n}" for n in range(request.allocation_size)]
    assert kubelet.admit(kube_pod(name, [container("cuda", {MEM: 100})], namespace="ml")).admitted
    yield
    plugins.stop()


def at(loop: Releaser, now: list[float], *times: float) -> None:
    """Run the pod-resources check at each of `times` (the loop's clock)."""
    for moment in times:
        now[0] = moment
        loop.check_with_kubelet()


def clocked(share: Rig, kubelet: KubeletEmulator, now: list[float], grace_s: float = 30) -> Releaser:
    assert kubelet.pod_resources_socket is not None
    loop = Releaser(
        share.ledger,
        share.pods,
        kubelet.pod_resources_socket,
        interval_s=60,
        grace_s=grace_s,
        clock=lambda: now[0],
    )
    loop.add_reconciler(share.allocator)
    return loop


def test_a_row_whose_devices_kubelet_shows_under_another_container_stays(
    share: Rig, kubelet: KubeletEmulator
) -> None:
    """Its container is not listed, but its device IDs are held: a row served as another pod keeps
    its devices until that is corrected (here the holder is no pod of the API's to move it to)."""
    served(share, "moved", 1)
    for _ in holding_gpu_1(kubelet, "elsewhere"):
        now = [0.0]
        at(clocked(share, kubelet, now), now, 0, 30, 60)
    assert [row.pod_name for row in share.ledger.active()] == ["moved"]


def test_a_row_served_as_another_pod_goes_to_the_container_kubelet_shows_holding_it(
    share: Rig, kubelet: KubeletEmulator
) -> None:
    """Served as "early" while kubelet admitted "late": once "early" is gone (it will not be served
    again), the pass gives the row, placement and all, to "late", instead of releasing it."""
    unconfirmed_row(share)  # "early" was served kubelet's devices 1-0..1-99
    for _ in holding_gpu_1(kubelet, "late"):
        now = [0.0]
        loop = clocked(share, kubelet, now)
        at(loop, now, 0)  # "early" may still come: nothing moves yet
        delete(share, "early")  # left to the pod-resources check: its row may be another pod's
        assert [row.pod_name for row in share.ledger.active()] == ["early"]
        at(loop, now, 1)
    (row,) = share.ledger.active()
    assert (row.pod_name, row.container, row.device_ids) == ("late", "cuda", tuple(ids(1, 0, 100)))


def test_a_run_to_completion_init_containers_row_stays_while_its_pod_lives(
    share: Rig, kubelet: KubeletEmulator
) -> None:
    """Kubelet never lists a finished init container: its row goes with its pod, not after the grace."""
    share.pod("staged", [("app", 100)], init=[("prepare", 200)])
    share.allocator.allocate(ids(0, 0, 200))
    share.allocator.allocate(ids(0, 0, 100))
    listing_pod(kubelet, "staged", "app")
    now = [0.0]
    at(clocked(share, kubelet, now), now, 0, 30, 60)
    assert sorted(row.container for row in share.ledger.active()) == ["app", "prepare"]


def test_the_grace_period_restarts_when_kubelet_shows_the_container_again(
    share: Rig, kubelet: KubeletEmulator
) -> None:
    uid = served(share, "flicker", 0)
    now = [0.0]
    loop = clocked(share, kubelet, now)
    at(loop, now, 0)  # absent from now
    listing_pod(kubelet, "flicker", "cuda")
    at(loop, now, 20)  # shown again
    kubelet.release("uid-flicker")
    at(loop, now, 25, 50)  # absent for 25 s only
    assert [row.pod_uid for row in share.ledger.active()] == [uid]
    at(loop, now, 55)
    assert share.ledger.active() == []


def test_an_unconfirmed_row_kubelet_never_shows_goes_after_the_grace(
    share: Rig, kubelet: KubeletEmulator
) -> None:
    """A deletion leaves an unconfirmed row to the pod-resources check; that check itself releases
    it once kubelet has not shown its container or its devices for the grace period."""
    unconfirmed_row(share)
    now = [0.0]
    at(clocked(share, kubelet, now), now, 0, 30)
    assert share.ledger.active() == []


def test_the_release_worker_reports_to_the_daemons_supervisor(share: Rig, tmp_path: Path) -> None:
    """Its crashes are restarted and counted under the name `release` (the supervisor's test hook
    makes each of its turns raise)."""
    faults = tmp_path / "faults"
    faults.write_text("release\n")
    supervisor = Supervisor(faults=faults)
    loop = Releaser(
        share.ledger, share.pods, tmp_path / "none.sock", interval_s=0.01, grace_s=60, supervisor=supervisor
    )
    loop.start()
    try:
        eventually(lambda: supervisor.restarts().get("release", 0) >= 1)
        assert any("worker release" in problem for problem in supervisor.problems())
    finally:
        loop.stop()


def test_without_the_api_server_kubelets_records_alone_release_rows(
    share: Rig, kubelet: KubeletEmulator
) -> None:
    """A daemon run without a kubeconfig has no pod cache: rows go once kubelet has not shown them
    for the grace period."""
    served(share, "unwatched", 0)
    assert kubelet.pod_resources_socket is not None
    now = [0.0]
    loop = Releaser(
        share.ledger, None, kubelet.pod_resources_socket, interval_s=60, grace_s=30, clock=lambda: now[0]
    )
    at(loop, now, 0, 29)
    assert len(share.ledger.active()) == 1
    at(loop, now, 30)
    assert share.ledger.active() == []


@pytest.fixture
def small_prune(monkeypatch: pytest.MonkeyPatch) -> None:
    """Released keys are dropped from the rows to check from 4 of them on (the product: 1,024)."""
    monkeypatch.setattr("deviceplugin.plugin.allocate.UNVERIFIED_PRUNE_MIN", 4)


def test_rows_to_check_stay_bounded_by_the_live_ones_when_nobody_checks(
    small_prune: None, share: Rig
) -> None:
    """Without kubelet's pod-resources nobody asks which rows to check, yet every row recorded while
    one is unconfirmed is one to check: those of released rows must not pile up (a leak per pod)."""
    kept = unconfirmed_row(share)  # stays live and unconfirmed
    for n in range(20):
        share.pod(f"p{n}", [("cuda", 100)], gpu_index="0", predicate_time=10 + n)
        share.allocator.allocate(ids(0, 0, 100))
        (served,) = [row for row in share.ledger.active() if row.pod_name != kept]
        assert share.ledger.release_pod(served.pod_uid, "test") == 1
        delete(share, served.pod_name)  # gone, as a released pod is: not a candidate again
        # the private set, read without pruning it (unverified() would): 1 live row, bound 2 x 1 + 4
        assert len(share.allocator._unverified) <= 6
    assert [row.pod_name for row in share.ledger.active()] == [kept]
