"""Every request the emulator answered: to assert how many API calls something made."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    query: str
    code: int  # 0 when no answer was sent (a held request released by stop)
    duration_s: float  # for watches: until the stream started
    started_at: float  # time.time()
    watch: bool

    @property
    def target(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path


class RequestLog:
    def __init__(self, limit: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._records: deque[RequestRecord] = deque(maxlen=limit)

    def record(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)

    def records(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    def count(
        self,
        *,
        method: str | None = None,
        path: str | None = None,
        watch: bool | None = None,
        since: float | None = None,
    ) -> int:
        """Requests matching every filter given; `path` is a substring of path and query."""
        return sum(
            1
            for record in self.records()
            if (method is None or record.method == method.upper())
            and (path is None or path in record.target)
            and (watch is None or record.watch == watch)
            and (since is None or record.started_at >= since)
        )

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
