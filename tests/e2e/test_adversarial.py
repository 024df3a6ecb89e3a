"""Adversarial cases for the daemon found after issue 13 was built: the real daemon as a
subprocess, the kubelet emulator over gRPC sockets, the API emulator."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

from deviceplugin.sim.apiserver import ApiServerEmulator
from deviceplugin.sim.kubelet import KubeletEmulator
from tests.daemons import Daemon, eventually
from tests.e2e import test_allocate as share


def rows(ledger: Path) -> list[tuple[str, str]]:
    """(pod, state) rows of the ledger file at `ledger`; none when it is not there."""
    if not ledger.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)) as db:
        return db.execute("SELECT pod_name, state FROM allocations ORDER BY pod_name").fetchall()


def test_a_removed_state_dir_is_restored_with_every_row(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    """`rm -rf` of the state dir under a running daemon: its writes went on into the unlinked
    file, readiness stayed green, and everything allocated since was gone at the next start.
    Now the next write (or readiness check) puts the whole ledger back at its path."""
    daemon = share.launch(start, apiserver, kubelet, workdir)
    share.admit(kubelet, share.make_pod(apiserver, "before", 1024), daemon)
    state = workdir / "state"
    shutil.rmtree(state)

    share.admit(kubelet, share.make_pod(apiserver, "during", 1024), daemon)
    ledger = state / "ledger.db"
    eventually(lambda: rows(ledger) == [("before", "allocated"), ("during", "allocated")], daemon)
    assert ledger.stat().st_mode & 0o777 == 0o600 and state.stat().st_mode & 0o777 == 0o700
    assert "ledger file removed" in daemon.output()
    share.admit(kubelet, share.make_pod(apiserver, "after", 1024), daemon)
    eventually(lambda: ("after", "allocated") in rows(ledger), daemon)
