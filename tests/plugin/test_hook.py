"""HAMi-core's host directory: which per-container cache directories stay."""

from __future__ import annotations

from pathlib import Path

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.plugin.hook import CONTAINER_CACHE_DIR, CONTAINER_LOCK_DIR, HookPath


def _response(*mounts: tuple[str, Path]) -> bytes:
    return pb.ContainerAllocateResponse(
        mounts=[pb.Mount(container_path=inside, host_path=str(host)) for inside, host in mounts]
    ).SerializeToString()


def test_directories_stay_exactly_while_a_live_response_mounts_them(tmp_path: Path) -> None:
    hook = HookPath(tmp_path)
    hook.prepare()
    mine = hook.container_dir("uid-a", "main")
    # A swapped row: pod b's container runs with the directory made under pod a's UID, and
    # pod a's own directory (uid-b_main) is no longer mounted by anyone.
    orphan = hook.container_dir("uid-b", "main")
    crashed = hook.container_dir("uid-c", "main")  # an Allocate that died before its ledger write
    hook.keep_mounted([_response((CONTAINER_CACHE_DIR, mine), (CONTAINER_LOCK_DIR, hook.lock))])
    assert mine.is_dir()
    assert not orphan.exists() and not crashed.exists()
    assert hook.lock.is_dir()  # the shared lock directory is never a cache directory
    hook.keep_mounted([])
    assert not mine.exists()


def test_nothing_to_do_before_the_hook_directory_exists(tmp_path: Path) -> None:
    HookPath(tmp_path / "absent").keep_mounted([])
    assert not (tmp_path / "absent").exists()
