"""Foreground emulator commands: block until SIGTERM or SIGINT, reliably, from the main thread."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """Python-level handler so the signal is caught; the wakeup pipe carries it to the main thread."""


@contextmanager
def stop_signals() -> Iterator[Callable[[], None]]:
    """Catch SIGTERM and SIGINT; yields a function that blocks until one arrives.

    It reads signal.set_wakeup_fd's pipe instead of waiting on an Event: the kernel may hand the
    signal to a server thread, and then a main thread blocked on a lock never runs the Python handler.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd)
    previous = {sig: signal.signal(sig, _ignore) for sig in STOP_SIGNALS}

    def wait() -> None:
        while os.read(read_fd, 1)[0] not in STOP_SIGNALS:
            continue

    try:
        yield wait
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous_fd)
        os.close(read_fd)
        os.close(write_fd)


class Stopped(BaseException):
    """SIGTERM or SIGINT arrived inside `stop_raises`. A BaseException, like KeyboardInterrupt, so
    that no `except Exception` takes it for an error: it unwinds through every `finally`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    for sig in STOP_SIGNALS:  # a second signal must not cut short the clean-up the first started
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


@contextmanager
def stop_raises() -> Iterator[None]:
    """Inside: the first SIGTERM or SIGINT raises `Stopped` in the main thread (the default SIGTERM
    ends the process on the spot, skipping every clean-up); later ones are ignored."""
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
