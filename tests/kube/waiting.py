"""Waiting on a condition in the API-facing tests (never on the clock alone)."""

from __future__ import annotations

import time
from collections.abc import Callable

WAIT_S = 20.0


def wait_for(check: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    """Whether `check` came true within `timeout_s` (polled every 20 ms)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False
