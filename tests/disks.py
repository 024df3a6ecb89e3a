"""Real small filesystems for storage-fault tests: a tmpfs to fill and give back, an ext4 image on
a loop device that the kernel turns read-only as after a disk error. A test is skipped, with the
reason, where mounting is not permitted."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode:
        pytest.skip(f"mount {' '.join(args)} is not permitted here: {done.stderr.strip()}")


def _unmount(path: Path) -> None:
    # Lazy: a daemon may still hold the ledger open; the filesystem goes once it lets go.
    subprocess.run(["umount", "-l", str(path)], check=True)


class Disk:
    """A small tmpfs mounted at `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        """Take every free block (large writes, then smaller ones for what is left)."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for size in (1 << 16, 1 << 12, 1 << 9):
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError as err:
                    if err.errno != errno.ENOSPC:
                        raise
        finally:
            os.close(fd)

    def free(self) -> None:
        self.filler.unlink()


@contextmanager
def tmpfs(path: Path, size: str = "8m") -> Iterator[Disk]:
    path.mkdir(exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    try:
        yield Disk(path)
    finally:
        _unmount(path)


@contextmanager
def failing_ext4(path: Path, image: Path) -> Iterator[Path]:
    """An ext4 filesystem on a loop device mounted at `path` with `errors=remount-ro`, as node
    disks usually are; yields the file that reports a filesystem error when written, after which
    the kernel turns the mount read-only under whatever holds files open, as on a failing disk."""
    with image.open("wb") as out:
        out.truncate(16 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True, check=False)
    if made.returncode:
        pytest.skip(f"mkfs.ext4 is not available: {made.stderr.strip()}")
    path.mkdir(exist_ok=True)
    _mount("-o", "loop,errors=remount-ro", str(image), str(path))
    try:
        found = subprocess.run(
            ["findmnt", "-n", "-o", "SOURCE", str(path)], capture_output=True, text=True, check=True
        )
        trigger = Path("/sys/fs/ext4") / Path(found.stdout.strip()).name / "trigger_fs_error"
        if not trigger.exists():
            pytest.skip(f"{trigger} is missing: this kernel cannot inject an ext4 error")
        yield trigger
    finally:
        _unmount(path)
