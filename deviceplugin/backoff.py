"""Exponential back-off, the one policy every retrying loop uses.

A `Backoff` is a value: the wait after the first failure in a row, the factor each further failure
multiplies it by and the most it may reach. Each loop names its own (`API_CALL_RETRY`,
`OUTBOX_RETRY`, `WORKER_RESTART`, ...) after what the wait protects, next to the loop. A loop
that keeps its run of failures in memory holds a `Retries`; one that keeps it elsewhere (the
outbox's attempt counts are ledger rows) asks `Backoff.delay` directly.
"""

from __future__ import annotations

from dataclasses import dataclass

# Past this many doublings every policy is at its cap; stops the power overflowing a float.
_MAX_STEPS = 64


@dataclass(frozen=True, slots=True)
class Backoff:
    start_s: float
    max_s: float
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not self.start_s > 0:
            raise ValueError(f"back-off start_s must be above 0, got {self.start_s!r}")
        if not self.max_s >= self.start_s:
            raise ValueError(f"back-off max_s must be at least start_s {self.start_s!r}, got {self.max_s!r}")
        if not self.factor >= 1:
            raise ValueError(f"back-off factor must be at least 1, got {self.factor!r}")

    def delay(self, failures: int) -> float:
        """The wait after `failures` failures in a row (1: the first)."""
        return min(self.start_s * self.factor ** min(max(failures, 1) - 1, _MAX_STEPS), self.max_s)


class Retries:
    """One loop's current run of failures under `policy` (not thread-safe: one loop owns it)."""

    def __init__(self, policy: Backoff) -> None:
        self.policy = policy
        self.failures = 0

    def failed(self) -> float:
        """Count a failure; returns how long to wait before trying again."""
        self.failures += 1
        return self.policy.delay(self.failures)

    def succeeded(self) -> None:
        """The run of failures is over: the next failure waits `start_s` again."""
        self.failures = 0
