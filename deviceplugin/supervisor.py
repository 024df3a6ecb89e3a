"""Supervision of the background workers (`deviceplugin.worker.Worker`): what a crash costs, and
who gets to know.

A worker whose loop raises (or returns without being asked to stop) is logged with its name and the
exception, counted, and restarted after a back-off that doubles with every crash in a row
(`WORKER_RESTART`). A loop reports each turn of work it completes (`Worker.turn`), which ends a run
of crashes. While a worker waits out its back-off it is *down*; after `LOOP_CRASHES` crashes with no
completed turn between them it is *restarting in a loop* until it completes one. Either makes its
owner unready: `Supervisor.problems` names the worker and the exception, and the daemon's and the
extender's `/readyz` answer 503 with that text.

Test hook: a `Supervisor` given a `faults` file (the daemon takes its path from
`$DEVICEPLUGIN_WORKER_FAULTS`) makes each worker named in it, one name a line, raise
`InjectedFault` at the end of every turn while the file names it. Tests use it for the workers no
fault at a real boundary reaches (the API server, the GPU backend); nothing else sets it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from deviceplugin.backoff import Backoff

FAULTS_ENV = "DEVICEPLUGIN_WORKER_FAULTS"
LOOP_CRASHES = 3  # crashes without a completed turn between them: restarting in a loop
# The wait before a restart, by crashes in a row. A crash is a bug or a broken dependency:
# restarting fast only floods the log.
WORKER_RESTART = Backoff(start_s=0.2, max_s=30.0)


class InjectedFault(RuntimeError):
    """Raised by the test hook: a crash no real boundary produced."""


class Supervised(Protocol):
    name: str

    def problem(self) -> str: ...


class Supervisor:
    """The workers of one daemon or one extender: restart counts by worker name (kept across
    reloads, which replace the workers) and the problems readiness reports."""

    def __init__(self, backoff: Backoff = WORKER_RESTART, faults: Path | None = None) -> None:
        self.backoff = backoff
        self.faults = faults
        self._lock = threading.Lock()
        self._workers: list[Supervised] = []
        self._restarts: Counter[str] = Counter()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Supervisor:
        path = env.get(FAULTS_ENV)
        return cls(faults=Path(path) if path else None)

    def attach(self, worker: Supervised) -> None:
        """A worker started: readiness watches it from now on."""
        with self._lock:
            self._workers.append(worker)
            self._restarts[worker.name] += 0  # listed with 0 until it first crashes

    def detach(self, worker: Supervised) -> None:
        """A worker stopped when asked to: it no longer counts for readiness."""
        with self._lock:
            self._workers = [other for other in self._workers if other is not worker]

    def crashed(self, name: str) -> None:
        with self._lock:
            self._restarts[name] += 1

    def restarts(self) -> dict[str, int]:
        """Crashes (each followed by a restart) by worker name, for every worker ever started."""
        with self._lock:
            return dict(self._restarts)

    def problems(self) -> list[str]:
        """Why a worker makes the owner unready (down or restarting in a loop), one line each."""
        with self._lock:
            workers = list(self._workers)
        return [problem for worker in workers if (problem := worker.problem())]

    def inject(self, name: str) -> None:
        """Raise `InjectedFault` while the test hook's file names worker `name`."""
        if self.faults is None:
            return
        try:
            named = self.faults.read_text().splitlines()
        except OSError:
            return  # not written yet
        if name in named:
            raise InjectedFault(f"fault injected into worker {name} by {self.faults}")
