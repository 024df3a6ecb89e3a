"""`deviceplugin simulate` removes its temporary directory, and stops every daemon it started, on
every way out: a run that behaved, one that did not, Ctrl-C or SIGTERM while the cluster is kept
running, and SIGTERM while it is starting (issue 19 item 6: /tmp/dpsim-* piled up).

simulate runs as a user runs it (a subprocess) with $TMPDIR pointing at a directory of the test's
own: it makes its directory there (the one it names in its first line), so what it leaves behind is
there to see."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kubesim.scratch import scratch_dir

TIMEOUT_S = 120.0
FITS = """
apiVersion: v1
kind: Pod
metadata: {name: small}
spec:
  containers:
  - {name: main, image: cuda, resources: {limits: {volcano.sh/gpu-memory: "1024"}}}
"""
TOO_BIG = FITS.replace("small", "huge").replace('"1024"', '"99999"')


class Simulate:
    """`deviceplugin simulate ARGS` with its own $TMPDIR; its stdout read line by line as it comes."""

    def __init__(self, tmpdir: Path, *args: str) -> None:
        env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "deviceplugin.cli", "simulate", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for_line(self, start: str) -> None:
        while not any(line.startswith(start) for line in self.seen):
            try:
                self.seen.append(self.lines.get(timeout=TIMEOUT_S))
            except queue.Empty:
                raise AssertionError(f"no line starting {start!r} in\n{''.join(self.seen)}") from None

    def directory(self) -> Path:
        """The directory simulate says its files are in."""
        self.wait_for_line("starting:")
        found = re.search(r"\(files in (\S+)\)", self.seen[-1])
        assert found, self.seen[-1]
        return Path(found[1])

    def finish(self) -> tuple[int, str]:
        """Exit status and stderr."""
        assert self.process.stderr is not None
        err = self.process.stderr.read()
        return self.process.wait(TIMEOUT_S), err


def processes_under(directory: Path) -> list[str]:
    """Command lines of running processes that name `directory` (the daemons get paths in it)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if str(directory) in cmdline:
            found.append(cmdline)
    return found


@pytest.fixture
def tmpdir_of_simulate() -> Iterator[Path]:
    with scratch_dir("tmp-") as path:
        yield path


@pytest.fixture
def start_simulate(tmpdir_of_simulate: Path) -> Iterator[Callable[..., Simulate]]:
    started: list[Simulate] = []

    def start(*args: str) -> Simulate:
        started.append(Simulate(tmpdir_of_simulate, *args))
        return started[-1]

    yield start
    for run in started:  # one a failed test left running is stopped (it cleans up on SIGTERM)
        if run.process.poll() is None:
            run.process.terminate()
            try:
                run.process.wait(TIMEOUT_S)
            except subprocess.TimeoutExpired:
                run.process.kill()
                run.process.wait()


def assert_cleaned_up(directory: Path, tmpdir: Path) -> None:
    assert not directory.exists()
    assert directory.parent == tmpdir  # made where $TMPDIR says
    assert sorted(p.name for p in tmpdir.iterdir()) == []
    assert processes_under(directory) == []


@pytest.mark.parametrize(("pods", "status"), [(FITS, 0), (TOO_BIG, 1)], ids=["behaved", "did-not-behave"])
def test_a_finished_run_leaves_nothing(
    start_simulate: Callable[..., Simulate], tmpdir_of_simulate: Path, tmp_path: Path, pods: str, status: int
) -> None:
    scenario = tmp_path / "pods.yaml"
    scenario.write_text(pods)
    run = start_simulate("--scenario", str(scenario))
    directory = run.directory()
    code, err = run.finish()
    assert code == status, err
    assert_cleaned_up(directory, tmpdir_of_simulate)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_stopping_a_kept_cluster_leaves_nothing(
    start_simulate: Callable[..., Simulate], tmpdir_of_simulate: Path, tmp_path: Path, stop: signal.Signals
) -> None:
    scenario = tmp_path / "pods.yaml"
    scenario.write_text(FITS)
    run = start_simulate("--scenario", str(scenario), "--keep-running")
    directory = run.directory()
    run.wait_for_line("Ctrl-C stops it.")
    assert processes_under(directory) != []  # the cluster is up
    run.process.send_signal(stop)
    code, err = run.finish()
    assert code == 0, err
    assert_cleaned_up(directory, tmpdir_of_simulate)


def test_sigterm_while_starting_stops_the_nodes_and_leaves_nothing(
    start_simulate: Callable[..., Simulate], tmpdir_of_simulate: Path
) -> None:
    run = start_simulate()
    directory = run.directory()
    run.process.send_signal(signal.SIGTERM)
    code, err = run.finish()
    assert code == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == "deviceplugin simulate: stopped by SIGTERM"
    assert_cleaned_up(directory, tmpdir_of_simulate)
