"""The ledger's files on the node's disk: kept private, read as storage problems when SQLite fails
on them, and moved aside when they cannot be used.

The ledger names pods, containers and the devices and answers they got: the directory is 0700
and the database with its `-wal`, `-shm` and `-journal` files 0600 (SQLite gives those the
database file's mode), tightened when found wider. A failed SQLite call whose cause is the disk
(full, read-only, failing, damaged, locked by another process) becomes a `StorageError` naming
the problem, so callers can answer with it and retry once the disk recovers.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import stat
import time
from pathlib import Path

from deviceplugin.logs import get_log

log = get_log(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
SUFFIXES = ("", "-wal", "-shm", "-journal")  # the database and SQLite's files beside it

# What a failed call says about the disk (`StorageError.problem`).
DISK_FULL = "disk-full"
READ_ONLY = "read-only"
IO_ERROR = "io-error"
CORRUPT = "corrupt"
LOCKED = "locked"

# SQLite's primary result codes (the low byte of an extended code).
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_IOERR = 5, 6, 8, 10
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 11, 13, 14, 26


class StorageError(Exception):
    """The disk under the ledger failed a read or write; `problem` says how (`DISK_FULL`,
    `READ_ONLY`, `IO_ERROR`, `CORRUPT`, `LOCKED`). Nothing was changed; the same call works again
    once the disk does (but for `CORRUPT`)."""

    def __init__(self, problem: str, message: str) -> None:
        super().__init__(message)
        self.problem = problem


def _write_refused(path: Path) -> OSError | None:
    """Why the file cannot be opened for writing now (None: it can)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CLOEXEC))
    except OSError as err:
        return err
    return None


def _free_space(directory: Path) -> str:
    try:
        usage = shutil.disk_usage(directory)
    except OSError:
        return "free space unknown"
    return f"{usage.free} of {usage.total} bytes free"


def storage_error(err: sqlite3.Error, path: Path) -> StorageError | None:
    """`err` read as a problem of the disk under the ledger at `path`; None when it is not one (a
    bug: the caller lets it through)."""
    code = getattr(err, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    where = f"the ledger {path}"
    if primary == _SQLITE_FULL:
        return StorageError(DISK_FULL, f"{where} cannot be written: disk full ({_free_space(path.parent)})")
    if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return StorageError(
            CORRUPT, f"{where} is damaged ({err}); it is moved aside and rebuilt at the next start"
        )
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return StorageError(LOCKED, f"{where} is locked by another process ({err})")
    if primary in (_SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CANTOPEN):
        refused = _write_refused(path)
        if primary == _SQLITE_READONLY or (refused is not None and refused.errno == errno.EROFS):
            return StorageError(READ_ONLY, f"{where} cannot be written: read-only file system ({err})")
        cause = f": {refused.strerror}" if refused is not None else ""
        return StorageError(IO_ERROR, f"{where} cannot be used: I/O error ({err}{cause})")
    return None


def private_dir(directory: Path) -> None:
    """Create `directory` (and its parents) or narrow it to `DIR_MODE`."""
    directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    _narrow(directory, DIR_MODE)


def private_files(path: Path) -> None:
    """Create the database file with `FILE_MODE` when missing (SQLite then gives its `-wal` and
    `-shm` the same) and narrow the ones present."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE))
    for suffix in SUFFIXES:
        _narrow(Path(f"{path}{suffix}"), FILE_MODE)


def _narrow(path: Path, mode: int) -> None:
    try:
        found = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return
    if found & ~mode:
        path.chmod(mode)
        log.warning("ledger file mode tightened", path=str(path), was=oct(found), now=oct(mode))


def move_aside(path: Path, now: float | None = None) -> Path:
    """Rename the database and SQLite's files beside it to `<name>.corrupt-<UTC time>` (plus
    their suffixes, so the set still opens together for a look); returns the database's new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    taken = 0
    while target.exists():  # moved aside twice within a second: keep both
        taken += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{taken}")
    for suffix in SUFFIXES:
        source = Path(f"{path}{suffix}")
        if source.exists():
            source.rename(f"{target}{suffix}")
    return target
