"""Shared fixtures: a short temp dir, the kubelet and API-server emulators, the daemon's API
client, the daemon launcher."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deviceplugin.kube.api import Kube, load_client
from deviceplugin.sim.apiserver import ApiServerEmulator
from deviceplugin.sim.kubelet import KubeletEmulator
from tests.daemons import Daemon

# Daemons started by tests listen for metrics on a free port, never the fixed production one.
os.environ.setdefault("METRICS_ADDRESS", "127.0.0.1:0")


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # Unix socket paths must stay short
    (path / "plugins").mkdir()
    yield path
    for child in sorted(path.rglob("*"), reverse=True):
        child.unlink() if not child.is_dir() else child.rmdir()
    path.rmdir()


@pytest.fixture
def apiserver() -> Iterator[ApiServerEmulator]:
    with ApiServerEmulator(bookmark_interval_s=0.5) as server:
        yield server


@pytest.fixture
def kube(apiserver: ApiServerEmulator, tmp_path: Path) -> Kube:
    return Kube(load_client(apiserver.write_kubeconfig(tmp_path / "kubeconfig")))


@pytest.fixture
def kubelet(workdir: Path) -> Iterator[KubeletEmulator]:
    pod_resources = workdir / "pod-resources.sock"
    with KubeletEmulator(workdir / "plugins", pod_resources_socket=pod_resources) as emulator:
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
            "--pod-resources-socket",
            str(workdir / "pod-resources.sock"),
            *args,
            env=env,
        )
        running.append(daemon)
        return daemon

    yield launch
    for daemon in running:
        daemon.stop()
