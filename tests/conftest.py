"""Fixtures for tests that run the daemon: a short temp dir, the kubelet emulator, daemon launcher."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deviceplugin.sim.kubelet import KubeletEmulator
from tests.daemons import Daemon


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # Unix socket paths must stay short
    (path / "plugins").mkdir()
    yield path
    for child in sorted(path.rglob("*"), reverse=True):
        child.unlink() if not child.is_dir() else child.rmdir()
    path.rmdir()


@pytest.fixture
def kubelet(workdir: Path) -> Iterator[KubeletEmulator]:
    with KubeletEmulator(workdir / "plugins") as emulator:
        yield emulator


@pytest.fixture
def start(workdir: Path) -> Iterator[Callable[..., Daemon]]:
    running: list[Daemon] = []

    def launch(*args: str, env: dict[str, str] | None = None) -> Daemon:
        daemon = Daemon(
            workdir / "plugins",
            "--node-name",
            "node-1",
            "--state-dir",
            str(workdir / "state"),
            *args,
            env=env,
        )
        running.append(daemon)
        return daemon

    yield launch
    for daemon in running:
        daemon.stop()
