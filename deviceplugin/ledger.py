"""The allocation ledger: what this node handed out (SQLite, WAL; docs/ledger.md says how durably).

One row per (pod UID, container, resource) with the GPUs, memory and cores given, kubelet's
device IDs and the exact response sent, so a repeated Allocate gets the same answer and metrics
and `inspect` read usage from here. An outbox of API patches is written in the same transaction
as the allocation it belongs to, so a crash can neither lose nor double one. Rows are released
(not deleted) when the pod goes away and purged after a retention period.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, KeysView, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from deviceplugin.ledgerfiles import (
    CORRUPT,
    IO_ERROR,
    StorageError,
    move_aside,
    private_dir,
    private_files,
    storage_error,
)
from deviceplugin.logs import get_log

log = get_log(__name__)

SCHEMA_VERSION = 1
RETENTION_S = 24 * 3600
PROBE_INTERVAL_S = 1.0  # while a write fails, how often `problem()` tries one again
# SQLite's level for commits (docs/ledger.md): NORMAL survives kill -9 at any instant; a commit
# reaches the disk before its outbox patches leave (`due`), not before Allocate answers.
SYNCHRONOUS = "NORMAL"

# Each entry moves the schema from version n to n + 1; never edit one that has shipped.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE allocations (
        pod_uid TEXT NOT NULL,
        container TEXT NOT NULL,
        resource TEXT NOT NULL,
        namespace TEXT NOT NULL,
        pod_name TEXT NOT NULL,
        device_key TEXT NOT NULL,          -- kubelet's device IDs, sorted, comma-joined
        device_ids TEXT NOT NULL,          -- JSON list, in kubelet's order
        response BLOB NOT NULL,            -- the serialized ContainerAllocateResponse
        state TEXT NOT NULL CHECK (state IN ('allocated', 'released')),
        allocated_at REAL NOT NULL,
        released_at REAL,
        release_reason TEXT,
        PRIMARY KEY (pod_uid, container, resource)
    );
    CREATE INDEX allocations_by_devices ON allocations (resource, device_key) WHERE state = 'allocated';
    CREATE TABLE allocation_gpus (
        pod_uid TEXT NOT NULL,
        container TEXT NOT NULL,
        resource TEXT NOT NULL,
        position INTEGER NOT NULL,         -- the device's place in the container's list
        gpu_uuid TEXT NOT NULL,
        gpu_index INTEGER NOT NULL,
        memory INTEGER NOT NULL,           -- MiB
        cores INTEGER NOT NULL,            -- percent of the GPU's compute
        PRIMARY KEY (pod_uid, container, resource, position),
        FOREIGN KEY (pod_uid, container, resource) REFERENCES allocations ON DELETE CASCADE
    );
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        target TEXT NOT NULL CHECK (target IN ('pod', 'node')),
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        patch TEXT NOT NULL,               -- JSON: {"annotations": {...}} (null removes a key)
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at REAL NOT NULL,
        last_error TEXT,
        created_at REAL NOT NULL
    );
    """,
)


class LedgerError(Exception):
    """The ledger file cannot be used."""


class CorruptLedger(LedgerError):
    """The file is not a ledger this program can use: not an SQLite database, damaged, failing
    SQLite's integrity check, or holding another schema (another program's, a newer version's)."""


@dataclass(frozen=True, slots=True)
class GpuShare:
    """What one container holds of one GPU."""

    uuid: str
    index: int
    memory: int
    cores: int = 0


@dataclass(frozen=True, slots=True)
class Allocation:
    pod_uid: str
    namespace: str
    pod_name: str
    container: str
    resource: str
    gpus: tuple[GpuShare, ...]
    device_ids: tuple[str, ...]
    response: bytes
    allocated_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Patch:
    """An annotation patch to apply to a pod or to the node (None removes a key)."""

    target: str  # "pod" or "node"
    namespace: str
    name: str
    annotations: Mapping[str, str | None]
    uid: str = ""  # the pod's: a pod of the same name created later is another pod ("": not known)


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    id: int
    patch: Patch
    attempts: int


@dataclass(frozen=True, slots=True)
class GpuUsage:
    uuid: str
    index: int
    memory: int
    cores: int
    pods: int


@dataclass(frozen=True, slots=True)
class PodGpuUsage:
    """What one pod holds of one GPU, over all its containers."""

    namespace: str
    pod_name: str
    uuid: str
    index: int
    memory: int
    cores: int


Key = tuple[str, str, str]  # (pod UID, container, resource): one allocation


@dataclass(frozen=True, slots=True)
class Move:
    """A live row that kubelet's records give to another container: its key, and its true owner."""

    key: Key
    pod_uid: str
    namespace: str
    pod_name: str
    container: str

    @property
    def new_key(self) -> Key:
        return (self.pod_uid, self.container, self.key[2])


def device_key(device_ids: Iterable[str]) -> str:
    return ",".join(sorted(device_ids))


class Holding:
    """Whether the ledger holds a live row for a key, as of now: a view of the ledger's live set,
    asked without copying it (Allocate asks on every call). Membership only: a set that changes
    while another thread walks it cannot be walked safely; `Ledger.served()` is a snapshot.
    `vacated` counts the times keys left it (rows released, or moved to other containers)."""

    __slots__ = ("_keys", "vacated")

    def __init__(self, keys: KeysView[Key]) -> None:
        self._keys = keys
        self.vacated = 0

    def __contains__(self, key: object) -> bool:
        return key in self._keys


NOTHING = Holding({}.keys())  # a ledger that holds nothing, ever


class HeldElsewhere:
    """The containers (pod UID, container) the ledger holds a live row of for another resource
    than `resource`, as of now: a view that Allocate asks on every call, answered from the asked
    pod's own rows (a handful), so a question costs the same with 10 or 10,000 rows live. True
    when any other resource holds a row. Membership only, as `Holding`."""

    __slots__ = ("_by_pod", "_by_resource", "_lock", "_resource")

    def __init__(
        self,
        by_pod: Mapping[str, set[Key]],
        by_resource: Mapping[str, set[Key]],
        lock: threading.RLock,
        resource: str,
    ) -> None:
        self._by_pod = by_pod
        self._by_resource = by_resource
        self._lock = lock  # the ledger's: its indexes change under it, from other threads
        self._resource = resource

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, tuple) or len(item) != 2:
            return False
        uid, container = item
        with self._lock:
            rows = self._by_pod.get(uid, ())
            return any(held == container and other != self._resource for _, held, other in rows)

    def __bool__(self) -> bool:
        with self._lock:
            return any(name != self._resource for name in self._by_resource)


_INSERT_ALLOCATION = (
    "INSERT INTO allocations (pod_uid, container, resource, namespace, pod_name,"
    " device_key, device_ids, response, state, allocated_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'allocated', ?)"
)
# An outbox entry due now, unless it is a pod's held back (parameters: now, the last id held back).
_DUE = "next_attempt_at <= ? AND (target = 'node' OR id > ?)"


def _patch_text(patch: Patch) -> str:
    """An outbox row's `patch` column: the annotations, and the pod's UID when known."""
    stored: dict[str, object] = {"annotations": dict(patch.annotations)}
    if patch.uid:
        stored["uid"] = patch.uid
    return json.dumps(stored)


def _patch(target: str, namespace: str, name: str, text: str) -> Patch:
    stored = json.loads(text)
    return Patch(target, namespace, name, stored["annotations"], stored.get("uid", ""))


def _configure(db: sqlite3.Connection) -> None:
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
    db.execute("PRAGMA foreign_keys=ON")


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file is at `path` (device, inode); None when none is."""
    try:
        found = path.stat()
    except OSError:  # gone, or its directory unreadable: either way not the file open
        return None
    return found.st_dev, found.st_ino


def _schema(db: sqlite3.Connection) -> list[tuple[str, str, str]]:
    return db.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
    ).fetchall()


@functools.cache
def _schema_of(version: int) -> list[tuple[str, str, str]]:
    """The tables and indexes a ledger at `version` holds, as the migrations make them."""
    db = sqlite3.connect(":memory:")
    for migration in MIGRATIONS[:version]:
        db.executescript(migration)
    return _schema(db)


StorageListener = Callable[[StorageError | None], None]


class Ledger:
    """Thread-safe: one connection, one lock; every write is one transaction. A call the disk
    fails (full, read-only, failing) raises `StorageError` and changes nothing; `problem()` says
    what stops writes until one succeeds again."""

    def __init__(self, path: Path, clock: Any = time.time) -> None:
        """Open or create the ledger at `path` (directory 0700, files 0600). `CorruptLedger` when
        the file is not a ledger this program can use, `StorageError` when the disk refuses it."""
        self.path = path
        self._clock = clock
        self._lock = threading.RLock()
        self.replaced: Path | None = None  # where `open` moved an unusable ledger: to be rebuilt
        self.created = not path.exists()  # a new ledger: on a node that ran pods, one that was lost
        self.storage_errors: Counter[str] = Counter()  # failed calls by problem, for metrics
        self._problem: StorageError | None = None
        self._probed_at = -math.inf  # by `clock`
        self._listeners: list[StorageListener] = []
        self._sent: set[int] = set()  # outbox entries sent that a failed write could not forget
        try:
            private_dir(path.parent)
            private_files(path)
        except OSError as err:
            raise LedgerError(f"ledger {path}: {err}") from None
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._file = _identity(path)
        try:
            self._check()  # first: a file found unusable is moved aside as it was
            _configure(self._db)
            self._migrate()
            rows = self._db.execute(
                "SELECT pod_uid, container, resource, device_key FROM allocations WHERE state = 'allocated'"
            )
            # The live rows' keys and device keys, mirrored in memory and kept as rows change:
            # Allocate asks on every call, release on every pod event.
            self._live: dict[Key, str] = {}
            self._by_devices: dict[tuple[str, str], Key] = {}
            self._by_pod: dict[str, set[Key]] = {}
            self._by_resource: dict[str, set[Key]] = {}
            self.holding = Holding(self._live.keys())
            for uid, container, resource, devices in rows.fetchall():
                self._remember((uid, container, resource), devices)
        except LedgerError:
            self._db.close()
            raise
        except sqlite3.Error as err:
            self._db.close()
            problem = storage_error(err, path)
            if problem is not None and problem.problem == CORRUPT:
                raise CorruptLedger(f"ledger {path}: {err}") from None
            if problem is not None:
                raise problem from None
            raise LedgerError(f"ledger {path}: {err}") from None

    @classmethod
    def open(cls, path: Path) -> Ledger:
        """The ledger at `path`. One that cannot be used (`CorruptLedger`) is moved aside as
        `<name>.corrupt-<UTC time>` and a new, empty one started; its `replaced` names where the
        old one went, for the caller to rebuild the rows from what kubelet and the pods say."""
        try:
            return cls(path)
        except CorruptLedger as err:
            moved = move_aside(path)
            log.error(
                "ledger unusable: moved aside, a new one is started", error=str(err), moved_to=str(moved)
            )
        ledger = cls(path)
        ledger.replaced = moved
        return ledger

    def _check(self) -> None:
        """CorruptLedger unless the file passes SQLite's integrity check and holds this program's
        tables at a schema version it knows."""
        found = [row[0] for row in self._db.execute("PRAGMA integrity_check(5)")]
        if found != ["ok"]:
            raise CorruptLedger(f"ledger {self.path} fails SQLite's integrity check: {'; '.join(found)}")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise CorruptLedger(
                f"ledger {self.path} has schema version {version}; this program knows up to {SCHEMA_VERSION}"
            )
        if _schema(self._db) != _schema_of(version):
            raise CorruptLedger(
                f"ledger {self.path} does not hold the tables of ledger schema version {version}"
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- the disk -----------------------------------------------------------------------------

    def add_listener(self, listener: StorageListener) -> None:
        """Call `listener(problem)` when writes start failing (or fail another way) and with None
        when they work again; called with the ledger's lock held, so it must not block."""
        self._listeners.append(listener)

    def remove_listener(self, listener: StorageListener) -> None:
        self._listeners.remove(listener)

    def problem(self) -> StorageError | None:
        """What stops the ledger writing, None when nothing does. While something does, a write is
        tried again (at most once per `PROBE_INTERVAL_S`), so this clears by itself once the disk
        recovers, with nothing else to write."""
        with self._lock:
            now = self._clock()
            removed = _identity(self.path) != self._file  # noticed without waiting for a write
            if (removed and self._problem is None) or (
                self._problem is not None and now - self._probed_at >= PROBE_INTERVAL_S
            ):
                self._probed_at = now
                with contextlib.suppress(StorageError), self._transaction() as db:
                    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")  # rewrites a page
            return self._problem

    @contextmanager
    def _disk(self) -> Iterator[None]:
        """SQLite failures that come from the disk raised as `StorageError`, counted and kept as
        the ledger's problem until a write succeeds; any other is a bug and passes as it is."""
        try:
            yield
        except (sqlite3.Error, StorageError) as err:
            problem = err if isinstance(err, StorageError) else storage_error(err, self.path)
            if problem is None:
                raise
            self.storage_errors[problem.problem] += 1
            if self._problem is None or self._problem.problem != problem.problem:
                log.error("ledger cannot be written", problem=problem.problem, error=str(problem))
                for listener in self._listeners:
                    listener(problem)
            self._problem = problem
            raise problem from err

    def _written(self) -> None:
        self._sent.clear()
        if self._problem is not None:
            self._problem = None
            log.info("ledger written again", path=str(self.path))
            for listener in self._listeners:
                listener(None)

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._disk():
            yield self._db

    @contextmanager
    def _transaction(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction (first forgetting the entries a failed `done` could not).
        `durable=False` skips the fsync (WAL, synchronous=NORMAL): for bookkeeping whose loss in a
        crash is harmless, like marking an idempotent patch sent."""
        switch = not durable and SYNCHRONOUS != "NORMAL"  # at NORMAL already: no PRAGMA round trip
        with self._lock, self._disk():
            self._restore_if_removed()
            if self._db.in_transaction:  # a COMMIT or ROLLBACK the disk failed can leave one open
                self._db.execute("ROLLBACK")
            if switch:
                self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    if self._sent:
                        self._db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in self._sent])
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        with contextlib.suppress(sqlite3.Error):  # the failure that got here is the one
                            self._db.execute("ROLLBACK")
                    raise
            finally:
                if switch:
                    self._db.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
            self._written()

    def _restore_if_removed(self) -> None:
        """The file at the ledger's path is no longer the one open (the state dir was removed, or
        the file replaced): writes would go on into an unlinked file, lost at the next start. The
        open connection still reads every row, so it is copied back to the path and used there."""
        if _identity(self.path) == self._file:
            return
        log.error("ledger file removed or replaced while open: restoring it", path=str(self.path))
        try:
            private_dir(self.path.parent)
            if self.path.exists():
                move_aside(self.path)
            private_files(self.path)  # empty and 0600: VACUUM INTO fills it
        except OSError as err:
            raise StorageError(
                IO_ERROR, f"the ledger {self.path} was removed and cannot be restored: {err}"
            ) from None
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
        self._db.execute("VACUUM INTO ?", (str(self.path),))
        restored = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        _configure(restored)
        self._db.close()
        self._db, self._file = restored, _identity(self.path)
        log.info("ledger restored at its path", path=str(self.path), rows=len(self._live))

    def _remember(self, key: Key, devices: str) -> None:
        self._live[key] = devices
        self._by_devices[(key[2], devices)] = key
        self._by_pod.setdefault(key[0], set()).add(key)
        self._by_resource.setdefault(key[2], set()).add(key)

    def _forget(self, key: Key) -> str:
        """Drop a live key from the memory indexes; returns its device key."""
        devices = self._live.pop(key)
        if self._by_devices.get((key[2], devices)) == key:
            del self._by_devices[(key[2], devices)]
        for index, part in ((self._by_pod, key[0]), (self._by_resource, key[2])):
            keys = index[part]
            keys.discard(key)
            if not keys:
                del index[part]
        return devices

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        for number in range(version, SCHEMA_VERSION):
            with self._transaction() as db:
                for statement in MIGRATIONS[number].split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {number + 1}")
            log.info("ledger schema migrated", path=str(self.path), version=number + 1)

    # --- allocations --------------------------------------------------------------------------

    def record(self, allocation: Allocation, patches: Iterable[Patch] = ()) -> Allocation:
        """Store a served container and the patches it calls for, atomically. Returns the row as
        stored: an existing allocated row for the same key wins (the container was served)."""
        now = self._clock()
        key = (allocation.pod_uid, allocation.container, allocation.resource)
        devices = device_key(allocation.device_ids)
        stored = dataclasses.replace(allocation, allocated_at=now)
        with self._lock:  # held past the commit, so the in-memory set follows committed rows only
            with self._transaction() as db:
                existing = self._get(db, *key) if key in self._live else None
                if existing is not None:
                    return existing
                self._insert(db, stored, devices)
                self._enqueue(db, patches, now)
            self._remember(key, devices)
        return stored

    def _insert(self, db: sqlite3.Connection, allocation: Allocation, devices: str) -> None:
        """Write a live row (replacing a released one with its key); `devices`: its `device_key`,
        which the caller has already."""
        key = (allocation.pod_uid, allocation.container, allocation.resource)
        row = (
            *key,
            allocation.namespace,
            allocation.pod_name,
            devices,
            json.dumps(list(allocation.device_ids)),
            allocation.response,
            allocation.allocated_at,
        )
        # A key is seldom taken: one statement then, not a DELETE that finds nothing before it.
        if db.execute(_INSERT_ALLOCATION + " ON CONFLICT DO NOTHING", row).rowcount == 0:
            db.execute("DELETE FROM allocations WHERE pod_uid = ? AND container = ? AND resource = ?", key)
            db.execute(_INSERT_ALLOCATION, row)
        db.executemany(
            "INSERT INTO allocation_gpus VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(*key, n, g.uuid, g.index, g.memory, g.cores) for n, g in enumerate(allocation.gpus)],
        )

    def reassign(self, moves: Iterable[Move], patches: Iterable[Patch] = ()) -> None:
        """Give live rows to the containers that really hold them, atomically with `patches`.
        Every key a move takes must be free or left by another move (a swap of two rows is one
        call), else ValueError and nothing changes."""
        moves = list(moves)
        with self._lock:
            leaving = {move.key for move in moves}
            taken = [move.new_key for move in moves]
            if (
                len(leaving) != len(moves)
                or len(set(taken)) != len(taken)
                or any(key in self._live and key not in leaving for key in taken)
                or not leaving <= self._live.keys()
            ):
                raise ValueError(f"moves {moves}: each must move one live row to a key nothing else holds")
            with self._transaction() as db:
                before = [self._get(db, *move.key) for move in moves]
                rows = [row for row in before if row is not None]
                db.executemany(
                    "DELETE FROM allocations WHERE pod_uid = ? AND container = ? AND resource = ?", leaving
                )
                for move, row in zip(moves, rows, strict=True):
                    self._insert(
                        db,
                        dataclasses.replace(
                            row,
                            pod_uid=move.pod_uid,
                            namespace=move.namespace,
                            pod_name=move.pod_name,
                            container=move.container,
                        ),
                        self._live[move.key],  # the row's device key, as it moves
                    )
                self._enqueue(db, patches, self._clock())
            devices = {key: self._forget(key) for key in leaving}
            for move in moves:
                self._remember(move.new_key, devices[move.key])
            self.holding.vacated += 1
        for move in moves:
            log.info("ledger reassigned", row=move.key, to=move.new_key)

    def _get(self, db: sqlite3.Connection, pod_uid: str, container: str, resource: str) -> Allocation | None:
        row = db.execute(
            "SELECT * FROM allocations"
            " WHERE pod_uid = ? AND container = ? AND resource = ? AND state = 'allocated'",
            (pod_uid, container, resource),
        ).fetchone()
        return None if row is None else self._allocation(db, row)

    def _allocation(self, db: sqlite3.Connection, row: tuple[Any, ...]) -> Allocation:
        (pod_uid, container, resource, namespace, pod_name, _, device_ids, response, _, allocated_at, *_) = (
            row
        )
        gpus = db.execute(
            "SELECT gpu_uuid, gpu_index, memory, cores FROM allocation_gpus"
            " WHERE pod_uid = ? AND container = ? AND resource = ? ORDER BY position",
            (pod_uid, container, resource),
        ).fetchall()
        return Allocation(
            pod_uid=pod_uid,
            namespace=namespace,
            pod_name=pod_name,
            container=container,
            resource=resource,
            gpus=tuple(GpuShare(*gpu) for gpu in gpus),
            device_ids=tuple(json.loads(device_ids)),
            response=bytes(response),
            allocated_at=allocated_at,
        )

    def get(self, pod_uid: str, container: str, resource: str) -> Allocation | None:
        with self._reading():
            return self._get(self._db, pod_uid, container, resource)

    def find_by_devices(self, resource: str, device_ids: Iterable[str]) -> Allocation | None:
        """The live allocation that got exactly these kubelet device IDs (a repeated Allocate)."""
        with self._reading():
            key = self._by_devices.get((resource, device_key(device_ids)))
            return None if key is None else self._get(self._db, *key)

    def active(self) -> list[Allocation]:
        with self._reading():
            rows = self._db.execute(
                "SELECT * FROM allocations WHERE state = 'allocated' ORDER BY allocated_at"
            )
            return [self._allocation(self._db, row) for row in rows.fetchall()]

    def served(self) -> frozenset[Key]:
        """(pod UID, container, resource) of every live allocation: a copy (see `holding`)."""
        with self._lock:
            return frozenset(self._live)

    def containers_held_except(self, resource: str) -> HeldElsewhere:
        """The containers served for another resource than `resource`: a live view (no copy)."""
        return HeldElsewhere(self._by_pod, self._by_resource, self._lock, resource)

    def release_pod(self, pod_uid: str, reason: str) -> int:
        """Mark every live allocation of the pod released; returns how many."""
        with self._lock:
            keys = list(self._by_pod.get(pod_uid, ()))
            if not keys:
                return 0  # the common case for pod events: nothing to write
            with self._transaction() as db:
                cursor = db.execute(
                    "UPDATE allocations SET state = 'released', released_at = ?, release_reason = ?"
                    " WHERE pod_uid = ? AND state = 'allocated'",
                    (self._clock(), reason, pod_uid),
                )
                released = cursor.rowcount
            for key in keys:
                self._forget(key)
            self.holding.vacated += 1
        if released:
            log.info("ledger released", pod_uid=pod_uid, containers=released, reason=reason)
        return released

    def purge(self, retention_s: float = RETENTION_S) -> int:
        """Delete rows released longer ago than the retention."""
        with self._transaction() as db:
            cursor = db.execute(
                "DELETE FROM allocations WHERE state = 'released' AND released_at < ?",
                (self._clock() - retention_s,),
            )
            return cursor.rowcount

    def usage_by_gpu(self) -> list[GpuUsage]:
        """Memory, cores and pods per GPU over the live allocations."""
        with self._reading():
            rows = self._db.execute(
                "SELECT g.gpu_uuid, g.gpu_index, SUM(g.memory), SUM(g.cores), COUNT(DISTINCT g.pod_uid)"
                " FROM allocation_gpus g JOIN allocations a USING (pod_uid, container, resource)"
                " WHERE a.state = 'allocated' GROUP BY g.gpu_uuid, g.gpu_index ORDER BY g.gpu_index"
            ).fetchall()
        return [GpuUsage(*row) for row in rows]

    def usage_by_pod(self) -> list[PodGpuUsage]:
        """Memory and cores per (pod, GPU) over the live allocations."""
        with self._reading():
            rows = self._db.execute(
                "SELECT a.namespace, a.pod_name, g.gpu_uuid, g.gpu_index, SUM(g.memory), SUM(g.cores)"
                " FROM allocation_gpus g JOIN allocations a USING (pod_uid, container, resource)"
                " WHERE a.state = 'allocated' GROUP BY a.pod_uid, g.gpu_uuid ORDER BY a.namespace, a.pod_name"
            ).fetchall()
        return [PodGpuUsage(*row) for row in rows]

    def live_count(self) -> int:
        """Allocated (not released) rows."""
        with self._lock:
            return len(self._live)

    # --- outbox -------------------------------------------------------------------------------

    def _enqueue(self, db: sqlite3.Connection, patches: Iterable[Patch], now: float) -> None:
        db.executemany(
            "INSERT INTO outbox (target, namespace, name, patch, next_attempt_at, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [(p.target, p.namespace, p.name, _patch_text(p), now, now) for p in patches],
        )

    def enqueue(self, patches: Iterable[Patch]) -> None:
        with self._transaction() as db:
            self._enqueue(db, patches, self._clock())

    def due(self, limit: int = 50, hold_pods_through: int = 0) -> list[OutboxEntry]:
        """The entries of each pod or node that has one due (the oldest `limit` due ones name
        them), in ledger order, waiting ones included: a target's entries go together, so a
        later value always wins. Pod entries up to id `hold_pods_through` are held back."""
        with self._reading():
            rows = self._db.execute(
                "SELECT id, target, namespace, name, patch, attempts FROM outbox"
                " WHERE (target, namespace, name) IN"
                f" (SELECT target, namespace, name FROM outbox WHERE {_DUE} ORDER BY id LIMIT ?)"
                " ORDER BY id",
                (self._clock(), hold_pods_through, limit),
            ).fetchall()
            rows = [row for row in rows if row[0] not in self._sent]
        if rows:
            self._sync()  # what a patch tells the API server is on disk before it goes
        return [
            OutboxEntry(id, _patch(target, namespace, name, patch), attempts)
            for id, target, namespace, name, patch, attempts in rows
        ]

    def _sync(self) -> None:
        """Make every commit so far durable: fsync the write-ahead log, where a commit at
        synchronous=NORMAL waits in the page cache (a checkpoint syncs what it moves). Without the
        ledger's lock: an Allocate recording meanwhile does not wait for the disk."""
        if SYNCHRONOUS == "FULL":
            return  # every commit was synced
        wal = f"{self.path}-wal"
        try:
            fd = os.open(wal, os.O_RDONLY)
        except FileNotFoundError:
            return  # no log: every commit is in the database file, synced by its checkpoint
        except OSError as err:
            self._sync_failed(err)
        try:
            os.fsync(fd)
        except OSError as err:
            self._sync_failed(err)
        finally:
            os.close(fd)

    def _sync_failed(self, err: OSError) -> NoReturn:
        with self._lock, self._disk():
            raise StorageError(IO_ERROR, f"ledger {self.path}: the write-ahead log cannot be synced: {err}")

    def more_due_than(self, limit: int, hold_pods_through: int = 0) -> bool:
        """Whether over `limit` entries are due (pod entries up to `hold_pods_through` held back)."""
        with self._reading():
            found = self._db.execute(
                f"SELECT COUNT(*) FROM (SELECT 1 FROM outbox WHERE {_DUE} LIMIT ?)",
                (self._clock(), hold_pods_through, limit + 1),
            ).fetchone()[0]
        return int(found) > limit

    def due_in(self, hold_pods_through: int = 0) -> float | None:
        """Seconds until the next entry is due (0 or less: one is), None when none waits; pod
        entries up to id `hold_pods_through` are not counted."""
        with self._reading():
            first = self._db.execute(
                "SELECT MIN(next_attempt_at) FROM outbox WHERE target = 'node' OR id > ?",
                (hold_pods_through,),
            ).fetchone()[0]
            return None if first is None else float(first) - self._clock()

    def last_outbox_id(self) -> int:
        """The newest entry's id, 0 when the outbox is empty (ids only grow)."""
        with self._reading():
            return int(self._db.execute("SELECT COALESCE(MAX(id), 0) FROM outbox").fetchone()[0])

    def done(self, entry_ids: Iterable[int]) -> None:
        """Forget sent patches. Not fsynced: after a crash a patch is at worst sent again, and every
        outbox patch is idempotent. When the disk refuses (see `problem`), they are kept as sent in
        memory, left out of `due` and forgotten by the next write that succeeds."""
        ids = [(entry_id,) for entry_id in entry_ids]
        with self._lock:
            try:
                with self._transaction(durable=False) as db:
                    db.executemany("DELETE FROM outbox WHERE id = ?", ids)
            except StorageError:
                self._sent.update(entry_id for (entry_id,) in ids)

    def retry_later(self, entry_id: int, error: str, delay_s: float) -> None:
        """Put off a failed entry. When the disk refuses (see `problem`), the entry stays due as it
        was: a patch that failed is tried again, no sooner than the outbox resumes."""
        with contextlib.suppress(StorageError), self._transaction(durable=False) as db:
            db.execute(
                "UPDATE outbox SET attempts = attempts + 1, last_error = ?, next_attempt_at = ? WHERE id = ?",
                (error, self._clock() + delay_s, entry_id),
            )

    def outbox_size(self) -> int:
        with self._reading():
            return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]) - len(self._sent)
