"""Shared fixtures: a short temp dir, the kubelet and API-server emulators, the daemon's API
client, the daemon launcher. Every temporary directory of the run lives in one removed at its end."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deviceplugin.kube.api import Kube, load_client
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from kubesim.scratch import scratch_dir, short_temp_root
from tests.daemons import Daemon

# Daemons started by tests listen for metrics on a free port, never the fixed production one.
os.environ.setdefault("METRICS_ADDRESS", "127.0.0.1:0")

# One directory holds every temporary directory of the run: pytest's tmp_path, the fixtures' short
# socket directories (scratch_dir) and those of the processes the tests start ($TMPDIR). It is
# removed when pytest ends, whatever ends it (a failure, Ctrl-C, an internal error).
RUN_DIR = Path(tempfile.mkdtemp(prefix="dpt-", dir=short_temp_root()))
tempfile.tempdir = str(RUN_DIR)
os.environ["TMPDIR"] = str(RUN_DIR)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(RUN_DIR, ignore_errors=True)


@pytest.fixture
def workdir() -> Iterator[Path]:
    with scratch_dir("dp") as path:  # Unix socket paths must stay short
        (path / "plugins").mkdir()
        yield path


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
