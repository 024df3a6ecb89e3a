"""HAMi-core's host directory: which per-container cache directories stay."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.plugin.hook import CONTAINER_CACHE_DIR, CONTAINER_LOCK_DIR, READY, HookPath


def _response(*mounts: tuple[str, Path]) -> bytes:
    return pb.ContainerAllocateResponse(
        mounts=[pb.Mount(container_path=inside, host_path=str(host)) for inside, host in mounts]
    ).SerializeToString()


def test_directories_stay_exactly_while_a_live_response_mounts_them(tmp_path: Path) -> None:
    hook = HookPath(tmp_path)
    hook.prepare()
    mine = Path(hook.container_dir("uid-a", "main"))
    # A swapped row: pod b's container runs with the directory made under pod a's UID, and
    # pod a's own directory (uid-b_main) is no longer mounted by anyone.
    orphan = Path(hook.container_dir("uid-b", "main"))
    crashed = Path(hook.container_dir("uid-c", "main"))  # an Allocate that died before its ledger write
    hook.keep_mounted([_response((CONTAINER_CACHE_DIR, mine), (CONTAINER_LOCK_DIR, hook.lock))])
    assert mine.is_dir()
    assert not orphan.exists() and not crashed.exists()
    assert hook.lock.is_dir()  # the shared lock directory is never a cache directory
    hook.keep_mounted([])
    assert not mine.exists()


def test_nothing_to_do_before_the_hook_directory_exists(tmp_path: Path) -> None:
    HookPath(tmp_path / "absent").keep_mounted([])
    assert not (tmp_path / "absent").exists()


def test_prepare_tells_whether_cache_directories_were_already_there(tmp_path: Path) -> None:
    """A daemon that finds cache directories at start may be serving containers its ledger lost."""
    fresh = HookPath(tmp_path / "fresh")
    fresh.prepare()
    assert fresh.found_dirs is False
    (tmp_path / "used" / "vgpu" / "containers" / "uid-a_main").mkdir(parents=True)
    used = HookPath(tmp_path / "used")
    used.prepare()
    assert used.found_dirs is True


def test_a_missing_library_is_warned_with_its_path(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hook = HookPath(tmp_path)
    hook.prepare()
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage() == "HAMi-core library missing: vGPU containers cannot start"
    assert warning.fields == {"path": str(tmp_path / "libvgpu.so")}  # type: ignore[attr-defined]
    caplog.clear()
    (tmp_path / "libvgpu.so").write_bytes(b"HAMi-core")
    hook.prepare()
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []
    assert (tmp_path / "ld.so.preload").read_text() == "/usr/local/vgpu/libvgpu.so\n"


def test_a_stale_cache_directory_is_handed_out_empty(tmp_path: Path) -> None:
    hook = HookPath(tmp_path)
    hook.prepare()
    stale = Path(hook.container_dir("uid-a", "main"))
    (stale / "leftover").write_text("another incarnation's state")
    assert Path(hook.container_dir("uid-a", "main")) == stale
    assert list(stale.iterdir()) == []


def test_each_removed_cache_directory_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hook = HookPath(tmp_path)
    hook.prepare()
    gone = hook.container_dir("uid-a", "main")
    with caplog.at_level(logging.INFO, logger="deviceplugin.plugin.hook"):
        hook.keep_mounted([])
    removed = [r for r in caplog.records if r.getMessage() == "vgpu cache dir removed"]
    assert [r.fields for r in removed] == [{"path": str(gone)}]  # type: ignore[attr-defined]


def test_directories_made_ahead_are_handed_out_empty_shared_and_the_daemons(tmp_path: Path) -> None:
    """Allocate renames a directory made ahead into place: the container still gets an empty one
    of mode 0777 owned by the daemon's user, and the stock is made anew by the next start (an
    earlier run's, whatever is in it, is gone)."""
    hook = HookPath(tmp_path)
    hook.prepare()
    assert len(list(hook.ready.iterdir())) == READY
    (next(hook.ready.iterdir()) / "leftover").write_text("not a container's")
    hook = HookPath(tmp_path)  # the next start
    hook.prepare()
    assert [list(p.iterdir()) for p in hook.ready.iterdir()] == [[]] * READY
    handed = [
        Path(hook.container_dir(f"uid-{n}", "main")) for n in range(READY + 2)
    ]  # the last two made here
    for path in handed:
        status = path.stat()
        assert list(path.iterdir()) == []
        assert (status.st_mode & 0o777, status.st_uid) == (0o777, os.getuid())
    assert list(hook.ready.iterdir()) == []
    hook.refill()
    assert len(list(hook.ready.iterdir())) == READY
    hook.keep_mounted([])  # the stock is no container's: only handed-out directories go
    assert len(list(hook.ready.iterdir())) == READY
    assert list(hook.containers.iterdir()) == []


def test_an_empty_stale_directory_is_replaced_by_one_made_ahead(tmp_path: Path) -> None:
    hook = HookPath(tmp_path)
    hook.prepare()
    stale = Path(hook.container_path("uid-a", "main"))
    stale.mkdir(mode=0o700)
    assert Path(hook.container_dir("uid-a", "main")) == stale
    assert stale.stat().st_mode & 0o777 == 0o777
    assert len(list(hook.ready.iterdir())) == READY - 1


def test_a_directory_made_ahead_is_kept_until_served_or_its_pod_goes(tmp_path: Path) -> None:
    """Made before the Allocate: empty and shared; not removed as unmounted while it waits for its
    container; handed out as it is; dropped with its pod when no Allocate took it."""
    hook = HookPath(tmp_path)
    hook.prepare()
    hook.make_ahead("uid-a", "main")
    hook.make_ahead("uid-b", "main")
    made = Path(hook.container_path("uid-a", "main"))
    assert list(made.iterdir()) == [] and made.stat().st_mode & 0o777 == 0o777
    hook.keep_mounted([])  # a release elsewhere: neither is any live row's, both wait for theirs
    assert made.is_dir() and Path(hook.container_path("uid-b", "main")).is_dir()
    inode = made.stat().st_ino
    assert Path(hook.container_dir("uid-a", "main")) == made and made.stat().st_ino == inode
    hook.drop_ahead("uid-a")  # served: stays, for the live row that will mount it
    hook.drop_ahead("uid-b")
    assert sorted(p.name for p in hook.containers.iterdir()) == ["uid-a_main"]
    hook.keep_mounted([])  # handed out and mounted by no live row: removed as before
    assert list(hook.containers.iterdir()) == []


def test_a_stale_directory_is_not_taken_for_one_made_ahead(tmp_path: Path) -> None:
    hook = HookPath(tmp_path)
    hook.prepare()
    stale = Path(hook.container_path("uid-a", "main"))
    stale.mkdir()
    (stale / "leftover").write_text("an earlier incarnation's state")
    hook.make_ahead("uid-a", "main")
    assert (stale / "leftover").exists()
    assert Path(hook.container_dir("uid-a", "main")) == stale
    assert list(stale.iterdir()) == [] and stale.stat().st_mode & 0o777 == 0o777
    hook.drop_ahead("uid-a")
    assert stale.is_dir()
