"""A background loop on a named daemon thread: started, and stopped by an event the loop watches."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Worker:
    def __init__(
        self, name: str, loop: Callable[[], None], interrupt: Callable[[], None] | None = None
    ) -> None:
        self.name = name
        self.stopping = threading.Event()  # the loop ends soon after this is set
        self._loop = loop
        self._interrupt = interrupt  # wakes the loop from a wait on something other than `stopping`
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.stopping.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Set `stopping`, interrupt the loop's wait, and return once the loop has ended."""
        self.stopping.set()
        if self._thread is None:
            return
        if self._interrupt is not None:
            self._interrupt()
        self._thread.join()
        self._thread = None
