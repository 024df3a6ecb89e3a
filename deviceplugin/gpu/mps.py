"""MPS control daemons on an `mps` vGPU node (docs/mps.md): one per GPU, each with its own pipe and
log directory under the MPS root; started and restarted here, or (with a sidecar) only checked.

A GPU is marked unhealthy while its control daemon does not answer, and healthy again once it does:
kubelet then stops admitting pods to it, and an Allocate naming it is refused. Every talk with a
daemon goes through the control binary (`--mps-control`), as an operator would (`echo CMD |
nvidia-cuda-mps-control`), so tests and simulations run the same code over a stand-in
(`deviceplugin/gpu/fake_mps_control.py`).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from deviceplugin.backoff import Backoff, Retries
from deviceplugin.gpu.health import HealthState
from deviceplugin.logs import get_log
from deviceplugin.supervisor import Supervisor
from deviceplugin.worker import Worker

log = get_log(__name__)

MPS = "mps"  # this module's source of faults in HealthState: an Xid's own mark is not cleared by it
CHECK_S = 0.5  # how often each daemon is asked whether it answers
COMMAND_TIMEOUT_S = 10.0  # a daemon that takes longer to answer one command is down
QUERY = "get_default_active_thread_percentage"  # harmless; NVIDIA's plugin checks with it too
# The wait before starting a control daemon again, by failed starts in a row: a daemon that dies at
# once (no driver, a GPU in another compute mode) must not be restarted in a loop.
MPS_RESTART = Backoff(start_s=0.5, max_s=60.0)


class MpsError(Exception):
    """A control daemon could not be started, or did not answer a command."""


@dataclass(frozen=True, slots=True)
class MpsRoot:
    """Where the control daemons' directories live on the node (`--mps-root`, a host path: the
    containers mount them from there)."""

    root: Path

    def pipe_dir(self, uuid: str) -> Path:
        return self.root / uuid / "pipe"

    def log_dir(self, uuid: str) -> Path:
        return self.root / uuid / "log"

    @property
    def shm(self) -> Path:
        """The shared memory the MPS server and its clients meet in: the daemon's /dev/shm."""
        return self.root / "shm"


class MpsControl:
    """The control binary, run for one GPU's daemon at a time."""

    def __init__(self, binary: str, root: MpsRoot) -> None:
        self.binary = binary
        self.root = root

    def env(self, uuid: str) -> dict[str, str]:
        return {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": uuid,  # by UUID: an index would be remapped (NVIDIA's MPS docs)
            "CUDA_MPS_PIPE_DIRECTORY": str(self.root.pipe_dir(uuid)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.root.log_dir(uuid)),
        }

    def start(self, uuid: str) -> None:
        """`nvidia-cuda-mps-control -d` for the GPU; returns once it has gone to the background."""
        try:
            for directory in (self.root.pipe_dir(uuid), self.root.log_dir(uuid), self.root.shm):
                directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise MpsError(f"--mps-root {self.root.root}: {err}") from None
        self._run(uuid, ["-d"], "")

    def ask(self, uuid: str, command: str) -> str:
        """Send one command to the GPU's daemon; its answer."""
        return self._run(uuid, [], command + "\n")

    def _run(self, uuid: str, args: list[str], stdin: str) -> str:
        try:
            done = subprocess.run(
                [self.binary, *args],
                input=stdin,
                capture_output=True,
                text=True,
                env=self.env(uuid),
                timeout=COMMAND_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as err:
            raise MpsError(f"{self.binary}: {err}") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise MpsError(f"{self.binary} {' '.join(args) or stdin.strip()!r}: {said}")
        return done.stdout.strip()


class MpsDaemons:
    """The control daemon of every GPU of the node: checked every CHECK_S; when `managed`, one that
    does not answer is started (again) after MPS_RESTART's back-off, otherwise (a sidecar runs them)
    it is only reported. `health` follows: unhealthy while down, healthy once it answers."""

    def __init__(
        self,
        control: MpsControl,
        uuids: tuple[str, ...],
        health: HealthState,
        *,
        managed: bool,
        supervisor: Supervisor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.control = control
        self.uuids = uuids
        self.health = health
        self.managed = managed
        self.clock = clock
        self.starts: dict[str, int] = dict.fromkeys(uuids, 0)  # daemons started here, by GPU
        self._up: dict[str, bool | None] = dict.fromkeys(uuids)  # None: not checked yet
        self._retries = {uuid: Retries(MPS_RESTART) for uuid in uuids}
        self._due: dict[str, float] = dict.fromkeys(uuids, 0.0)  # when a start may be tried next
        self._lock = threading.Lock()  # one check at a time (the worker's, or `start`'s first)
        # The limits last set on each GPU's daemon (`ceiling`): a daemon that comes back has
        # forgotten them, and takes them again before its GPU is healthy.
        self._limits: dict[str, tuple[int, int]] = {}
        self._limits_lock = threading.Lock()  # `ceiling` (Allocates) and `_answers` (the checks)
        self._worker = Worker("mps-control", self._run, supervisor=supervisor)

    def start(self) -> None:
        """Check (and start) every daemon once, so the GPUs are healthy from the outset when they
        can be, then keep checking. Daemons are left running when the plugin stops: the containers
        using them run on, and the next start finds them answering."""
        self.check()
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def check(self) -> None:
        with self._lock:
            for uuid in self.uuids:
                self._check(uuid)

    def _check(self, uuid: str) -> None:
        try:
            self._answers(uuid)
        except MpsError as err:
            problem = str(err)
        else:
            self._mark(uuid, None)
            return
        self._mark(uuid, problem)  # its clients lost their server: said even when a restart follows
        if not self.managed or self.clock() < self._due[uuid]:
            return
        try:
            self.control.start(uuid)
            self.starts[uuid] += 1
            self._answers(uuid)
        except MpsError as err:
            delay = self._retries[uuid].failed()
            self._due[uuid] = self.clock() + delay
            log.error("mps control daemon cannot start", gpu=uuid, error=str(err), retry_s=delay)
            return
        log.info("mps control daemon started", gpu=uuid, pipe=str(self.control.root.pipe_dir(uuid)))
        self._mark(uuid, None)

    def _answers(self, uuid: str) -> None:
        """Ask the daemon the health query; one that was down (restarted here or by a sidecar)
        takes its GPU's last limits again first: a container's own limits are advice only."""
        self.control.ask(uuid, QUERY)
        if self._up[uuid] is False:
            with self._limits_lock:
                limits = self._limits.get(uuid)
                if limits is not None:
                    self._send(uuid, *limits)
                    log.info("mps limits restored", gpu=uuid, memory_mib=limits[0], percent=limits[1])

    def _mark(self, uuid: str, problem: str | None) -> None:
        was = self._up[uuid]
        self._up[uuid] = problem is None
        if problem is None:
            self._retries[uuid].succeeded()
            if was is not True:
                self.health.set((uuid,), healthy=True, reason="its MPS control daemon answers", source=MPS)
            return
        if was is not False:
            retry = "restarting it" if self.managed else "started by a sidecar: waiting for it"
            log.error("mps control daemon down", gpu=uuid, error=problem, then=retry)
            reason = f"its MPS control daemon does not answer: {problem}"
            self.health.set((uuid,), healthy=False, reason=reason, source=MPS)

    def _run(self) -> None:
        while not self._worker.stopping.wait(CHECK_S):
            self.check()
            self._worker.turn()

    def ceiling(self, uuid: str, memory_mib: int, percent: int) -> None:
        """Set what no client of the GPU's daemon may exceed, whatever its environment says: the
        pinned device memory (device 0: the daemon sees its one GPU) and the active thread
        percentage of the servers it starts next. Kept, to be set again should the daemon come
        back."""
        with self._limits_lock:
            self._send(uuid, memory_mib, percent)
            self._limits[uuid] = (memory_mib, percent)

    def restore(self, limits: Mapping[str, tuple[int, int]]) -> None:
        """`ceiling` for each GPU whose limits this process has not set yet (a plugin's start: a
        daemon may have died while no plugin ran; the node's allocators all call this, and a
        reload too). A daemon that does not take them is left to the next Allocate on its GPU,
        refused `mps-down` then if it still does not."""
        for uuid, (memory_mib, percent) in limits.items():
            with self._limits_lock:
                if uuid in self._limits:
                    continue
            try:
                self.ceiling(uuid, memory_mib, percent)
            except MpsError as err:
                log.warning("mps limits not restored", gpu=uuid, error=str(err))

    def _send(self, uuid: str, memory_mib: int, percent: int) -> None:
        self.control.ask(uuid, f"set_default_device_pinned_mem_limit 0 {memory_mib}M")
        self.control.ask(uuid, f"set_default_active_thread_percentage {percent}")
