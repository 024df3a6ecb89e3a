"""A background loop on a named daemon thread: started, stopped by an event the loop watches, and
restarted after a crash under its `Supervisor` (see `deviceplugin.supervisor`)."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable

from deviceplugin.logs import describe_exception, get_log
from deviceplugin.supervisor import LOOP_CRASHES, Supervisor

log = get_log(__name__)

MAX_ERROR = 500  # an exception's message may quote a value of any size


class LoopEnded(RuntimeError):
    """The loop returned although nobody asked it to stop."""


class Worker:
    def __init__(
        self,
        name: str,
        loop: Callable[[], None],
        interrupt: Callable[[], None] | None = None,
        *,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.name = name
        self.stopping = threading.Event()  # the loop ends soon after this is set
        self.supervisor = supervisor if supervisor is not None else Supervisor()
        self._loop = loop
        self._interrupt = interrupt  # wakes the loop from a wait on something other than `stopping`
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._in_a_row = 0  # crashes since the loop last completed a turn
        self._error = ""  # the last crash
        self._backing_off: float | None = None  # the back-off being waited out, None while running
        self._ended = ""  # what ended the thread for good (an exception no loop may catch)

    def start(self) -> None:
        self.stopping.clear()
        with self._lock:
            self._in_a_row, self._error, self._backing_off, self._ended = 0, "", None, ""
        self.supervisor.attach(self)
        self._thread = threading.Thread(target=self._supervise, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Set `stopping`, interrupt the loop's wait, and return once the loop has ended (at once
        during a back-off)."""
        self.stopping.set()
        if self._thread is None:
            return
        if self._interrupt is not None:
            self._interrupt()
        self._thread.join()
        self._thread = None
        self.supervisor.detach(self)

    def turn(self) -> None:
        """The loop calls this after each turn of work it completes: it works, so a run of crashes
        is over. Raises the test hook's fault while the hook names this worker."""
        self.supervisor.inject(self.name)
        with self._lock:
            self._in_a_row = 0

    def problem(self) -> str:
        """Why this worker makes its owner unready, or "" (running, or crashed once and restarted)."""
        with self._lock:
            if self._ended:
                return f"worker {self.name} has ended: {self._ended}"
            if self._in_a_row >= LOOP_CRASHES:
                return (
                    f"worker {self.name} is restarting in a loop: {self._in_a_row} crashes "
                    f"without a completed turn, the last {self._error}"
                )
            if self._backing_off is not None:
                return f"worker {self.name} crashed ({self._error}), restarting after {self._backing_off:g}s"
            return ""

    def _supervise(self) -> None:
        try:
            while True:
                try:
                    self._loop()
                    error: Exception = LoopEnded("the loop returned without being asked to stop")
                except Exception as err:  # whatever it is, the loop must go on: restart it
                    error = err
                if self.stopping.is_set():
                    return
                if self.stopping.wait(self._crashed(error)):
                    return
                with self._lock:
                    self._backing_off = None
        except BaseException as err:  # SystemExit and the like end the thread: say so, for good
            with self._lock:
                self._ended = describe_exception(err)[:MAX_ERROR]
            raise

    def _crashed(self, error: Exception) -> float:
        """Record, count and log a crash; returns the back-off before the restart."""
        text = describe_exception(error)[:MAX_ERROR]
        with self._lock:
            self._in_a_row += 1
            self._error = text
            in_a_row = self._in_a_row
            self._backing_off = delay = self.supervisor.backoff.delay(in_a_row)
        self.supervisor.crashed(self.name)
        log.error(
            "worker crashed, restarting",
            worker=self.name,
            error=text,
            crashes_in_a_row=in_a_row,
            retry_s=delay,
            traceback="".join(traceback.format_tb(error.__traceback__)),
        )
        return delay
