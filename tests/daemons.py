"""The node daemon in a subprocess and the kubelet emulator it registers with, for daemon tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from deviceplugin.gpu.fake import fake_uuid
from kubesim.kubelet import KubeletEmulator, ResourceState
from tests.kube.waiting import wait_for

TIMEOUT_S = 60.0  # a bound on waits, not a timing: a loaded 2-core runner took over 20 s to start a daemon
NODE = "node-1"  # the daemon's node in the end-to-end tests
VGPU = ("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores")
GPU0, GPU1 = fake_uuid(0), fake_uuid(1)


class Daemon:
    """`deviceplugin run` in a subprocess; stopped (and its output kept) at the end of the test."""

    def __init__(self, directory: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.log = directory.parent / f"daemon-{time.monotonic_ns()}.log"
        command = [
            sys.executable,
            "-m",
            "deviceplugin.cli",
            "run",
            "--device-plugin-dir",
            str(directory),
            *args,
        ]
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )

    def output(self) -> str:
        return self.log.read_text()

    def metrics_url(self) -> str:
        """The metrics listener's base URL, once the daemon has logged its port."""
        pattern = re.compile(r"metrics listening.*port=(\d+)")
        eventually(lambda: pattern.search(self.output()) is not None, self)
        return f"http://127.0.0.1:{pattern.findall(self.output())[-1]}"

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(TIMEOUT_S)


def streaming(*resources: str) -> Callable[[KubeletEmulator], bool]:
    def check(kubelet: KubeletEmulator) -> bool:
        states = [kubelet.resource(name) for name in resources]
        return all(s is not None and s.connected and s.messages > 0 for s in states)

    return check


def wait(kubelet: KubeletEmulator, predicate: Callable[[KubeletEmulator], bool], daemon: Daemon) -> None:
    assert kubelet.wait_for(predicate, TIMEOUT_S), daemon.output()


def eventually(check: Callable[[], bool], daemon: Daemon | None = None, timeout_s: float = TIMEOUT_S) -> None:
    """Poll `check` until it holds; fail (with the daemon's output, if any) when it never does."""
    if not wait_for(check, timeout_s):
        raise AssertionError(f"not within {timeout_s} s\n{daemon.output()[-4000:] if daemon else ''}")


def state(kubelet: KubeletEmulator, name: str) -> ResourceState:
    found = kubelet.resource(name)
    assert found is not None
    return found


def inject(events: Path, **line: object) -> None:
    with events.open("a") as out:
        out.write(json.dumps(line) + "\n")
