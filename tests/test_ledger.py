"""The allocation ledger: durable rows, idempotent records, outbox, release, usage, schema."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from deviceplugin.ledger import (
    PROBE_INTERVAL_S,
    SCHEMA_VERSION,
    Allocation,
    CorruptLedger,
    GpuShare,
    Ledger,
    LedgerError,
    Move,
    Patch,
)
from deviceplugin.ledgerfiles import DISK_FULL, StorageError
from tests.disks import tmpfs


def allocation(
    uid: str = "uid-a", container: str = "main", ids: tuple[str, ...] = ("0-1", "0-2"), memory: int = 2048
) -> Allocation:
    return Allocation(
        pod_uid=uid,
        namespace="ml",
        pod_name=f"pod-{uid}",
        container=container,
        resource="volcano.sh/gpu-memory",
        gpus=(GpuShare("GPU-0", 0, memory),),
        device_ids=ids,
        response=b"\x0a\x01x",
    )


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "state" / "ledger.db")


def test_record_and_read_back(ledger: Ledger) -> None:
    stored = ledger.record(
        allocation(), [Patch("pod", "ml", "pod-uid-a", {"volcano.sh/gpu-assigned": "true"})]
    )
    assert stored.allocated_at > 0
    again = ledger.get("uid-a", "main", "volcano.sh/gpu-memory")
    assert again == stored
    assert ledger.find_by_devices("volcano.sh/gpu-memory", ["0-2", "0-1"]) == stored  # order does not matter
    assert ledger.find_by_devices("volcano.sh/gpu-memory", ["0-1"]) is None
    assert ledger.served() == {("uid-a", "main", "volcano.sh/gpu-memory")}
    (entry,) = ledger.due()
    assert entry.patch == Patch("pod", "ml", "pod-uid-a", {"volcano.sh/gpu-assigned": "true"})


def test_a_second_record_for_the_same_container_keeps_the_first(ledger: Ledger) -> None:
    first = ledger.record(allocation(), [Patch("node", "", "n", {"gpu": None})])
    second = ledger.record(allocation(ids=("0-7",)), [Patch("node", "", "n", {"gpu": None})])
    assert second == first
    assert len(ledger.active()) == 1 and ledger.outbox_size() == 1  # no doubled patch either


def test_release_and_usage(ledger: Ledger) -> None:
    ledger.record(allocation("a", memory=1024))
    ledger.record(allocation("b", ids=("0-5",), memory=512))
    ledger.record(allocation("b", container="side", ids=("0-6",), memory=256))
    (usage,) = ledger.usage_by_gpu()
    assert (usage.uuid, usage.memory, usage.pods) == ("GPU-0", 1792, 2)
    assert ledger.release_pod("b", "pod deleted") == 2
    assert ledger.release_pod("b", "again") == 0
    assert [u.memory for u in ledger.usage_by_gpu()] == [1024]
    assert ledger.served() == {("a", "main", "volcano.sh/gpu-memory")}
    assert ledger.find_by_devices("volcano.sh/gpu-memory", ["0-5"]) is None


def test_released_container_can_be_served_again(ledger: Ledger) -> None:
    ledger.record(allocation())
    ledger.release_pod("uid-a", "test")
    fresh = ledger.record(allocation(ids=("0-9",)))
    assert fresh.device_ids == ("0-9",)
    assert [a.device_ids for a in ledger.active()] == [("0-9",)]
    assert ledger.find_by_devices("volcano.sh/gpu-memory", ["0-1", "0-2"]) is None
    assert ledger.find_by_devices("volcano.sh/gpu-memory", ["0-9"]) == fresh


def test_release_then_the_uid_served_again_then_release_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The second release takes the rows served since the first, and only them: the first
    incarnation's other container keeps its release time, so it is purged on its own schedule."""
    caplog.set_level(logging.INFO, logger="deviceplugin.ledger")
    now = [1000.0]
    ledger = Ledger(tmp_path / "l.db", clock=lambda: now[0])
    ledger.record(allocation("u", "main", ids=("0-1",)))
    ledger.record(allocation("u", "side", ids=("0-2",)))
    assert ledger.release_pod("u", "pod deleted") == 2
    now[0] += 100
    again = ledger.record(allocation("u", "main", ids=("0-3",)))
    assert ledger.served() == {("u", "main", "volcano.sh/gpu-memory")}
    assert ledger.find_by_devices("volcano.sh/gpu-memory", ["0-3"]) == again
    now[0] += 100
    assert ledger.release_pod("u", "pod deleted again") == 1
    assert ledger.served() == frozenset() and ledger.active() == [] and ledger.usage_by_gpu() == []
    assert ledger.find_by_devices("volcano.sh/gpu-memory", ["0-3"]) is None
    assert ledger.purge(retention_s=150) == 1  # "side", released 200 s ago; "main" 0 s ago stays
    assert ledger.release_pod("u", "a third time") == 0
    lines = [r.__dict__["fields"] for r in caplog.records if r.getMessage() == "ledger released"]
    assert lines == [
        {"pod_uid": "u", "containers": 2, "reason": "pod deleted"},
        {"pod_uid": "u", "containers": 1, "reason": "pod deleted again"},
    ]


def test_reassign_swaps_two_rows_with_their_patches_atomically(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    a = ledger.record(allocation("a", ids=("0-1",), memory=1024))
    b = ledger.record(allocation("b", ids=("1-1",), memory=2048))
    memory = "volcano.sh/gpu-memory"
    fix = Patch("pod", "ml", "pod-a", {"volcano.sh/gpu-index": "1"})
    ledger.reassign(
        [
            Move(("a", "main", memory), "b", "ml", "pod-b", "main"),
            Move(("b", "main", memory), "a", "ml", "pod-a", "main"),
        ],
        [fix],
    )
    ledger.close()
    reopened = Ledger(tmp_path / "ledger.db")
    assert reopened.find_by_devices(memory, ["0-1"]) == Allocation(
        "b", "ml", "pod-b", "main", memory, a.gpus, a.device_ids, a.response, a.allocated_at
    )
    assert reopened.find_by_devices(memory, ["1-1"]) == Allocation(
        "a", "ml", "pod-a", "main", memory, b.gpus, b.device_ids, b.response, b.allocated_at
    )
    assert reopened.served() == {("a", "main", memory), ("b", "main", memory)}
    assert {(u.pod_name, u.memory) for u in reopened.usage_by_pod()} == {("pod-a", 2048), ("pod-b", 1024)}
    assert [entry.patch for entry in reopened.due()] == [fix]


def test_reassign_takes_a_released_key_but_never_a_live_one(ledger: Ledger) -> None:
    memory = "volcano.sh/gpu-memory"
    ledger.record(allocation("a", ids=("0-1",)))
    ledger.record(allocation("b", ids=("1-1",)))
    with pytest.raises(ValueError, match="each must move one live row"):
        ledger.reassign(
            [Move(("a", "main", memory), "b", "ml", "pod-b", "main")], [Patch("pod", "ml", "x", {})]
        )
    assert ledger.get("a", "main", memory) is not None and ledger.outbox_size() == 0
    ledger.release_pod("b", "pod deleted")
    ledger.reassign([Move(("a", "main", memory), "b", "ml", "pod-b", "main")])
    moved = ledger.find_by_devices(memory, ["0-1"])
    assert moved is not None and (moved.pod_uid, moved.pod_name) == ("b", "pod-b")
    assert ledger.served() == {("b", "main", memory)}


def test_purge_drops_old_released_rows(tmp_path: Path) -> None:
    now = [1000.0]
    ledger = Ledger(tmp_path / "l.db", clock=lambda: now[0])
    ledger.record(allocation("old"))
    ledger.record(allocation("live", ids=("0-3",)))
    ledger.release_pod("old", "test")
    now[0] += 10
    assert ledger.purge(retention_s=60) == 0
    now[0] += 100
    assert ledger.purge(retention_s=60) == 1
    assert [a.pod_uid for a in ledger.active()] == ["live"]


def test_outbox_retries_and_completion(tmp_path: Path) -> None:
    now = [1000.0]
    ledger = Ledger(tmp_path / "l.db", clock=lambda: now[0])
    ledger.enqueue([Patch("node", "", "n", {"gpu": None}), Patch("pod", "ml", "p", {"a": "1"})])
    first, second = ledger.due()
    ledger.retry_later(first.id, "503", 5.0)
    assert [e.id for e in ledger.due()] == [second.id]
    ledger.done([second.id])
    assert ledger.due() == []
    now[0] += 5
    (again,) = ledger.due()
    assert again.attempts == 1
    ledger.done([again.id])
    assert ledger.outbox_size() == 0


def test_rows_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    Ledger(path).record(allocation(), [Patch("pod", "ml", "p", {"a": "1"})])
    reopened = Ledger(path)
    assert reopened.served() == {("uid-a", "main", "volcano.sh/gpu-memory")}
    assert reopened.find_by_devices("volcano.sh/gpu-memory", ["0-2", "0-1"]) == reopened.active()[0]
    assert reopened.record(allocation(memory=1)).gpus[0].memory == 2048  # still served: kept
    assert reopened.outbox_size() == 1


def test_commit_is_durable_across_kill_9(tmp_path: Path) -> None:
    """A record that returned is on disk even if the process dies right after."""
    path = tmp_path / "l.db"
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from deviceplugin.ledger import Allocation, GpuShare, Ledger
        ledger = Ledger(Path({str(path)!r}))
        gpu = (GpuShare("GPU-0", 0, 1),)
        for n in range(20):
            ledger.record(Allocation(f"uid-{{n}}", "ns", "p", "c", "r", gpu, (str(n),), b""))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], check=False)
    assert done.returncode == -9
    assert len(Ledger(path).active()) == 20


def test_schema_version_and_newer_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    Ledger(path).close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(LedgerError, match="schema version 2; this program knows up to 1"):
        Ledger(path)


def test_unusable_path_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(LedgerError) as refused:
        Ledger(blocker / "ledger.db")
    assert str(refused.value).startswith(f"ledger {blocker / 'ledger.db'}: [Errno 17] File exists")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_ledger_is_private_and_a_wider_directory_or_file_is_narrowed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows name pods, containers and their devices: directory 0700, database, -wal and -shm 0600,
    whatever the umask, and narrowed (with a log line each) when found wider."""
    state = tmp_path / "state"
    path = state / "ledger.db"
    first = Ledger(path)
    first.record(allocation())  # -wal and -shm exist while a connection is open
    files = [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm")]
    assert (mode(state), *map(mode, files)) == (0o700, 0o600, 0o600, 0o600)
    for each in (state, *files):
        each.chmod(0o755 if each.is_dir() else 0o644)
    with caplog.at_level(logging.WARNING):
        Ledger(path).close()
    assert (mode(state), *map(mode, files)) == (0o700, 0o600, 0o600, 0o600)
    narrowed = [r for r in caplog.records if r.getMessage() == "ledger file mode tightened"]
    assert len(narrowed) == 4
    first.close()


def _make(path: Path) -> None:
    ledger = Ledger(path)
    for n in range(30):
        ledger.record(allocation(f"uid-{n}", ids=(f"0-{n}",)))
    ledger.close()


def _not_a_database(path: Path) -> None:
    path.write_bytes(b"not an SQLite database\n" * 200)


def _damaged(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8192:12288] = bytes(range(256)) * 16  # a b-tree page of the allocations
    path.write_bytes(bytes(data))


def _index_off(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("PRAGMA writable_schema = ON")
        db.execute(
            "UPDATE sqlite_master SET sql = 'CREATE INDEX allocations_by_devices ON allocations (pod_name)'"
            " WHERE name = 'allocations_by_devices'"
        )


def _foreign(path: Path) -> None:
    path.unlink()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE notes (text TEXT)")


def _newer(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")


@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        pytest.param(_not_a_database, "file is not a database", id="not-sqlite"),
        pytest.param(_damaged, "malformed", id="malformed"),
        pytest.param(_index_off, "integrity check: row 1 missing from index", id="integrity"),
        pytest.param(_foreign, "does not hold the tables of ledger schema version 0", id="foreign-schema"),
        pytest.param(_newer, "schema version 2; this program knows up to 1", id="newer-schema"),
    ],
)
def test_an_unusable_ledger_is_moved_aside_and_a_new_one_started(
    tmp_path: Path, spoil: Callable[[Path], None], why: str
) -> None:
    path = tmp_path / "state" / "ledger.db"
    _make(path)
    spoil(path)
    kept = path.read_bytes()
    with pytest.raises(CorruptLedger, match=why):
        Ledger(path)
    ledger = Ledger.open(path)
    assert ledger.replaced is not None and ledger.replaced.parent == path.parent
    assert re.fullmatch(r"ledger\.db\.corrupt-\d{8}T\d{6}Z", ledger.replaced.name)
    assert ledger.replaced.read_bytes() == kept  # left as found, for a look
    assert ledger.active() == [] and ledger.outbox_size() == 0
    ledger.record(allocation())
    assert len(Ledger(path).active()) == 1
    assert Ledger.open(path).replaced is None  # the new one is fine


def test_a_full_disk_changes_nothing_and_passes(tmp_path: Path) -> None:
    """A write the disk refuses raises StorageError and leaves rows, outbox and memory as they
    were; a sent patch that cannot be forgotten is not handed out again; all of it is written
    once space returns (`problem()` tries a write by itself)."""
    now = [1000.0]
    with tmpfs(tmp_path / "disk") as disk:
        ledger = Ledger(disk.path / "ledger.db", clock=lambda: now[0])
        kept = ledger.record(allocation("kept"), [Patch("pod", "ml", "pod-kept", {"a": "1"})])
        (sent,) = ledger.due()
        ledger.enqueue([Patch("pod", "ml", "other", {"b": "1"})])
        disk.fill()

        with pytest.raises(StorageError, match="disk full") as refused:
            ledger.record(allocation("new", ids=("1-1",)), [Patch("pod", "ml", "pod-new", {"a": "1"})])
        assert refused.value.problem == DISK_FULL
        assert ledger.served() == {("kept", "main", "volcano.sh/gpu-memory")}
        assert ledger.find_by_devices("volcano.sh/gpu-memory", ["1-1"]) is None
        with pytest.raises(StorageError):
            ledger.release_pod("kept", "pod deleted")
        assert ledger.get("kept", "main", "volcano.sh/gpu-memory") == kept
        ledger.done([sent.id])  # the patch went out: it must not go out again
        (other,) = ledger.due()
        ledger.retry_later(other.id, "503", 60.0)  # cannot be put off: stays due as it was
        assert [entry.patch.name for entry in ledger.due()] == ["other"]
        assert ledger.outbox_size() == 1
        problem = ledger.problem()
        assert problem is not None and problem.problem == DISK_FULL
        assert ledger.storage_errors[DISK_FULL] >= 3

        disk.free()
        assert ledger.problem() is not None  # tried again at most once a second
        now[0] += PROBE_INTERVAL_S
        assert ledger.problem() is None
        ledger.close()
        reopened = Ledger(disk.path / "ledger.db")
        assert [entry.patch.name for entry in reopened.due()] == ["other"]
        assert reopened.served() == {("kept", "main", "volcano.sh/gpu-memory")}
        reopened.close()


# --- found by mutation testing (issue 14) -----------------------------------------------------


def test_the_on_disk_format_a_later_version_reads(tmp_path: Path) -> None:
    """Rows and outbox entries as stored, so a ledger written now is found again after an upgrade:
    kubelet's device IDs sorted and comma-joined (what a repeated Allocate is looked up by) and in
    kubelet's order as JSON; a pod patch's UID kept with it."""
    path = tmp_path / "l.db"
    ledger = Ledger(path)
    patch = Patch("pod", "ml", "p", {"a": "1", "b": None}, uid="uid-p")
    ledger.record(allocation(ids=("0-2", "0-10", "0-1")), [patch])
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT device_key, device_ids FROM allocations").fetchone() == (
            "0-1,0-10,0-2",
            '["0-2", "0-10", "0-1"]',
        )
        assert json.loads(db.execute("SELECT patch FROM outbox").fetchone()[0]) == {
            "annotations": {"a": "1", "b": None},
            "uid": "uid-p",
        }
        db.execute(
            "INSERT INTO outbox (target, namespace, name, patch, next_attempt_at, created_at)"
            """ VALUES ('pod', 'ml', 'q', '{"annotations": {"c": "1"}}', 0, 0)"""
        )
        db.commit()
    assert [entry.patch for entry in ledger.due()] == [patch, Patch("pod", "ml", "q", {"c": "1"})]
    assert ledger.get("uid-nobody", "main", "volcano.sh/gpu-memory") is None


def test_when_the_next_outbox_entry_is_due(tmp_path: Path) -> None:
    """`due_in` is what the outbox worker sleeps for: None with nothing queued; a retried entry's
    delay; pod entries the worker holds back do not count, node entries always do."""
    now = [1000.0]
    ledger = Ledger(tmp_path / "l.db", clock=lambda: now[0])
    assert ledger.due_in() is None
    ledger.enqueue([Patch("pod", "ml", "p", {"a": "1"})])
    (pod_entry,) = ledger.due()
    assert ledger.due_in() == 0.0
    ledger.retry_later(pod_entry.id, "503", 7.5)
    assert ledger.due_in() == 7.5
    now[0] += 2.5
    assert ledger.due_in() == 5.0
    assert ledger.due_in(hold_pods_through=pod_entry.id) is None  # held back: nothing else waits
    ledger.enqueue([Patch("node", "", "n", {"lock": None})])
    assert ledger.due_in(hold_pods_through=pod_entry.id) == 0.0
    assert ledger.last_outbox_id() == pod_entry.id + 1


def test_more_due_than_counts_exactly(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db")
    ledger.enqueue([Patch("pod", "ml", f"p{n}", {"a": "1"}) for n in range(3)])
    assert ledger.more_due_than(2) and not ledger.more_due_than(3)
    first = ledger.due()[0].id
    assert not ledger.more_due_than(2, hold_pods_through=first)
    assert ledger.more_due_than(1, hold_pods_through=first)


def test_reassign_moves_a_row_to_another_namespace_and_container(ledger: Ledger) -> None:
    memory = "volcano.sh/gpu-memory"
    row = ledger.record(allocation("a", ids=("0-1",)))
    ledger.reassign([Move(("a", "main", memory), "b", "team", "pod-b", "worker")])
    moved = ledger.get("b", "worker", memory)
    assert moved is not None
    assert (moved.namespace, moved.pod_name, moved.container, moved.device_ids) == (
        "team",
        "pod-b",
        "worker",
        row.device_ids,
    )
    assert [(u.namespace, u.pod_name) for u in ledger.usage_by_pod()] == [("team", "pod-b")]


def test_reassign_refuses_two_rows_onto_one_container(ledger: Ledger) -> None:
    memory = "volcano.sh/gpu-memory"
    ledger.record(allocation("a", ids=("0-1",)))
    ledger.record(allocation("b", ids=("0-2",)))
    onto_c = [Move((uid, "main", memory), "c", "ml", "pod-c", "main") for uid in ("a", "b")]
    with pytest.raises(ValueError, match="each must move one live row"):
        ledger.reassign(onto_c)
    assert ledger.served() == {("a", "main", memory), ("b", "main", memory)}


def test_listeners_hear_when_writes_fail_and_when_they_work_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What readiness and the node's LedgerUnwritable/LedgerWritable Events are driven by."""
    caplog.set_level(logging.INFO, logger="deviceplugin.ledger")
    heard: list[str | None] = []
    removed: list[str | None] = []
    with tmpfs(tmp_path / "disk") as disk:
        ledger = Ledger(disk.path / "ledger.db")
        assert ledger.problem() is None
        ledger.add_listener(lambda problem: heard.append(None if problem is None else problem.problem))

        def gone(problem: StorageError | None) -> None:
            removed.append(None if problem is None else problem.problem)

        ledger.add_listener(gone)
        ledger.remove_listener(gone)
        disk.fill()
        with pytest.raises(StorageError):
            ledger.record(allocation())
        disk.free()
        ledger.record(allocation())
        ledger.close()
    assert heard == [DISK_FULL, None] and removed == []
    (again,) = [r for r in caplog.records if r.getMessage() == "ledger written again"]
    assert again.__dict__["fields"] == {"path": str(disk.path / "ledger.db")}


def test_a_new_ledger_logs_its_schema_and_a_replaced_one_where_the_old_went(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin.ledger")
    path = tmp_path / "state" / "ledger.db"
    Ledger(path).close()
    _not_a_database(path)
    replaced = Ledger.open(path).replaced
    lines = [
        (r.getMessage(), r.__dict__["fields"]) for r in caplog.records if r.name == "deviceplugin.ledger"
    ]
    migrated = ("ledger schema migrated", {"path": str(path), "version": 1})
    assert lines[0] == migrated and lines[-1] == migrated
    message, fields = lines[1]
    assert message == "ledger unusable: moved aside, a new one is started"
    assert fields["moved_to"] == str(replaced) and "file is not a database" in fields["error"]


def test_the_live_view_and_its_indexes_agree_with_a_fresh_ledger_through_every_change(
    tmp_path: Path,
) -> None:
    """What Allocate and release read in memory (`holding`, `containers_held_except`, a pod's rows,
    rows by device IDs) is kept as rows change, not rebuilt: after each change it must say what a
    ledger opened afresh on the same file says, and `vacated` counts each time keys left. The
    views of containers held for another resource, taken once, answer as the set identify built
    from a copy of the live keys did: each (pod UID, container) with a row of another resource,
    true while any other resource holds a row."""
    path = tmp_path / "l.db"
    ledger = Ledger(path)
    memory, number = "volcano.sh/gpu-memory", "volcano.sh/vgpu-number"
    views = {resource: ledger.containers_held_except(resource) for resource in (memory, number)}

    def on(uid: str, container: str, resource: str, ids: tuple[str, ...]) -> Allocation:
        return dataclasses.replace(allocation(uid, container, ids), resource=resource)

    def agrees() -> None:
        fresh = Ledger(path)
        try:
            keys = fresh.served()
            assert ledger.served() == keys
            probes = keys | {
                (u, c, r) for u in ("a", "b", "c") for c in ("main", "side") for r in (memory, number)
            }
            assert {key for key in probes if key in ledger.holding} == keys
            pairs = {(u, c) for u in ("a", "b", "c", "d") for c in ("main", "side")}
            for resource, view in views.items():
                replaced = {(uid, container) for uid, container, other in keys if other != resource}
                assert {pair for pair in pairs if pair in view} == replaced
                assert bool(view) == any(other != resource for _, _, other in keys)
                assert ("a", "main", number) not in view  # a key is no container
            for row in fresh.active():
                assert ledger.find_by_devices(row.resource, row.device_ids) == row
            assert ledger.live_count() == fresh.live_count()
        finally:
            fresh.close()

    agrees()  # nothing held: every view false
    ledger.record(on("a", "main", memory, ("0-1",)))
    agrees()  # one resource: the other's view true, its own false
    ledger.record(on("a", "side", number, ("GPU-0",)))
    ledger.record(on("b", "main", memory, ("0-2",)))
    ledger.record(on("b", "main", number, ("GPU-1",)))  # one container held for both resources
    agrees()
    assert ledger.holding.vacated == 0
    assert ledger.release_pod("a", "pod deleted") == 2
    agrees()
    assert ledger.holding.vacated == 1
    assert ("a", "main") not in views[number] and ("a", "side") not in views[memory]
    assert ledger.release_pod("a", "again: nothing left") == 0
    assert ledger.holding.vacated == 1
    ledger.record(on("a", "main", memory, ("0-3",)))  # the UID served again after its release
    agrees()
    assert ("a", "main") in views[number]
    ledger.reassign([Move(("b", "main", memory), "c", "ml", "pod-c", "main")])
    agrees()
    assert ("c", "main") in views[number] and ("b", "main") in views[memory]
    assert ledger.holding.vacated == 2
    ledger.close()
    ledger = Ledger(path)  # a restart reads the same set back
    views = {resource: ledger.containers_held_except(resource) for resource in views}
    agrees()
    assert ledger.release_pod("c", "pod deleted") == 1
    agrees()
    assert ledger.served() == {("a", "main", memory), ("b", "main", number)}
