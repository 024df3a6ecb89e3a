"""Fault injection: rules that slow, fail, garble or hold matching requests, for the next N of them
or until cleared.

A rule matches on the HTTP method and on a substring of the request target (path and query, so
`path="watch=true"` picks watches). Thread-safe; held requests are released when their rule is
cleared or the server stops.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Latency:
    seconds: float


@dataclass(frozen=True)
class ErrorReply:
    """Answer with a `Status` of this code instead of serving the request."""

    code: int
    message: str = ""
    retry_after_s: int | None = None  # sent as Retry-After (429 and 503 clients honour it)


@dataclass(frozen=True)
class Hang:
    """Hold the request without an answer; a client with a timeout sees its timeout."""


@dataclass(frozen=True)
class Garbled:
    """Answer 200 with a body that is not JSON (a broken proxy in the way): the client cannot read
    it, and raises something other than an API error."""

    body: str = "<html>bad gateway</html>\n"  # ends a line: a watch client tries to parse it


Effect = Latency | ErrorReply | Hang | Garbled


class Fault:
    """One rule. Keep it to clear just this one."""

    def __init__(self, effect: Effect, method: str | None, path: str | None, times: int | None) -> None:
        self.effect = effect
        self.method = method.upper() if method else None
        self.path = path
        self.remaining = times
        self.hits = 0
        self.cleared = False

    def matches(self, method: str, target: str) -> bool:
        return (self.method is None or self.method == method) and (self.path is None or self.path in target)

    def __repr__(self) -> str:
        return f"Fault({self.effect}, method={self.method}, path={self.path}, remaining={self.remaining})"


class FaultInjector:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._faults: list[Fault] = []
        self._held: set[Fault] = set()
        self._stopping = False

    def add(
        self, effect: Effect, *, method: str | None = None, path: str | None = None, times: int | None = None
    ) -> Fault:
        fault = Fault(effect, method, path, times)
        with self._cond:
            self._faults.append(fault)
        return fault

    def latency(
        self, seconds: float, *, method: str | None = None, path: str | None = None, times: int | None = None
    ) -> Fault:
        return self.add(Latency(seconds), method=method, path=path, times=times)

    def error(
        self,
        code: int,
        *,
        message: str = "",
        retry_after_s: int | None = None,
        method: str | None = None,
        path: str | None = None,
        times: int | None = None,
    ) -> Fault:
        return self.add(ErrorReply(code, message, retry_after_s), method=method, path=path, times=times)

    def hang(self, *, method: str | None = None, path: str | None = None, times: int | None = None) -> Fault:
        return self.add(Hang(), method=method, path=path, times=times)

    def garble(
        self, *, method: str | None = None, path: str | None = None, times: int | None = None
    ) -> Fault:
        return self.add(Garbled(), method=method, path=path, times=times)

    def clear(self, fault: Fault | None = None) -> None:
        """Remove one rule, or all of them; requests they hold are released."""
        with self._cond:
            chosen = [fault] if fault is not None else [*self._faults, *self._held]
            for item in chosen:
                item.cleared = True
            self._faults = [item for item in self._faults if not item.cleared]
            self._cond.notify_all()

    def take(self, method: str, target: str) -> list[Fault]:
        """The rules that apply to this request, each counted once against its `times`."""
        with self._cond:
            taken = [fault for fault in self._faults if fault.matches(method, target)]
            for fault in taken:
                fault.hits += 1
                if fault.remaining is not None:
                    fault.remaining -= 1
            self._faults = [fault for fault in self._faults if fault.remaining is None or fault.remaining > 0]
            return taken

    def sleep(self, seconds: float) -> bool:
        """Wait out a latency; False if the server began stopping meanwhile."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopping, timeout=seconds)
            return not self._stopping

    def hold(self, fault: Fault) -> bool:
        """Block until `fault` is cleared (True: go on serving) or the server stops (False)."""
        with self._cond:
            self._held.add(fault)
            try:
                self._cond.wait_for(lambda: fault.cleared or self._stopping)
            finally:
                self._held.discard(fault)
            return not self._stopping

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
