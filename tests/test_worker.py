"""The background-loop helper every daemon part runs on, and its supervision: restarts with
back-off, crash loops, the test hook. Tests wait on states, never on the clock."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from deviceplugin.backoff import Backoff
from deviceplugin.supervisor import Supervisor
from deviceplugin.worker import Worker
from tests.kube.waiting import wait_for


def names() -> set[str]:
    return {thread.name for thread in threading.enumerate()}


def test_stop_ends_a_loop_that_waits_on_stopping_and_it_can_start_again() -> None:
    looping = threading.Event()
    worker: Worker

    def loop() -> None:
        while not worker.stopping.wait(0.01):
            looping.set()

    worker = Worker("loop-under-test", loop)
    for _ in range(2):  # the second start finds `stopping` set by the first stop
        looping.clear()
        worker.start()
        assert looping.wait(5)
        worker.stop()
        assert "loop-under-test" not in names()


def test_stop_interrupts_a_wait_on_something_else() -> None:
    items: queue.Queue[object] = queue.Queue()
    seen: list[object] = []

    def loop() -> None:
        while (item := items.get()) is not None:  # blocks with no timeout
            seen.append(item)

    worker = Worker("queue-under-test", loop, interrupt=lambda: items.put(None))
    worker.start()
    items.put("first")
    worker.stop()  # returns: the interrupt ended the blocking get
    assert seen == ["first"] and "queue-under-test" not in names()


def test_stop_before_start_does_nothing_to_interrupt() -> None:
    calls: list[str] = []
    worker = Worker("never-started", lambda: None, interrupt=lambda: calls.append("interrupt"))
    worker.stop()
    assert calls == [] and worker.stopping.is_set()


# --- supervision ------------------------------------------------------------------------------

QUICK = Backoff(start_s=0.001, max_s=0.001)  # restarts at once: the tests wait on states, not time


def crash_lines(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, object]]:
    return [
        record.fields  # type: ignore[attr-defined]
        for record in caplog.records
        if record.getMessage() == "worker crashed, restarting" and record.fields["worker"] == name  # type: ignore[attr-defined]
    ]


def test_a_crashed_loop_is_restarted_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    supervisor = Supervisor(QUICK)
    runs: list[int] = []
    worker: Worker

    def loop() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise ValueError("a bug on the first run")
        worker.turn()
        worker.stopping.wait()

    worker = Worker("crashes-once", loop, supervisor=supervisor)
    worker.start()
    try:
        assert wait_for(lambda: len(runs) == 2 and supervisor.problems() == [])
        assert supervisor.restarts() == {"crashes-once": 1}
        (line,) = crash_lines(caplog, "crashes-once")
        assert "ValueError" in str(line["error"]) and "a bug on the first run" in str(line["error"])
        assert "test_worker.py" in str(line["traceback"])
    finally:
        worker.stop()


def test_a_worker_is_down_while_it_backs_off_and_stop_does_not_wait_for_the_back_off() -> None:
    supervisor = Supervisor(Backoff(start_s=3600.0, max_s=3600.0))

    def loop() -> None:
        raise OSError("the device went away")

    worker = Worker("backs-off", loop, supervisor=supervisor)
    worker.start()
    assert wait_for(lambda: supervisor.problems() != [])
    (problem,) = supervisor.problems()
    assert problem.startswith("worker backs-off crashed") and "OSError" in problem
    assert "the device went away" in problem and "3600" in problem
    worker.stop()  # returns at once: an hour's back-off would hang the test
    assert supervisor.problems() == [] and "backs-off" not in names()


def test_crashes_with_no_completed_turn_between_them_are_a_loop_until_a_turn_completes() -> None:
    supervisor = Supervisor(QUICK)
    broken = threading.Event()
    broken.set()
    worker: Worker

    def loop() -> None:
        if broken.is_set():
            raise KeyError("poison")
        worker.turn()
        worker.stopping.wait()

    worker = Worker("loops", loop, supervisor=supervisor)
    worker.start()
    try:
        assert wait_for(lambda: any("restarting in a loop" in p for p in supervisor.problems()))
        (problem,) = supervisor.problems()
        assert problem.startswith("worker loops is restarting in a loop") and "KeyError" in problem
        assert supervisor.restarts()["loops"] >= 3
        broken.clear()
        assert wait_for(lambda: supervisor.problems() == [])  # it completed a turn
    finally:
        worker.stop()


def test_crashes_after_completed_turns_are_restarts_not_a_loop() -> None:
    supervisor = Supervisor(QUICK)
    seen: list[str] = []
    worker: Worker

    def loop() -> None:
        seen.append(worker.problem())  # what readiness says on every (re)start
        worker.turn()
        if len(seen) <= 5:
            raise RuntimeError("crash after a completed turn")
        worker.stopping.wait()

    worker = Worker("survives", loop, supervisor=supervisor)
    worker.start()
    try:
        assert wait_for(lambda: len(seen) == 6)
        assert seen == [""] * 6 and supervisor.restarts() == {"survives": 5}
        assert supervisor.problems() == []
    finally:
        worker.stop()


def test_a_loop_that_returns_unasked_is_restarted(caplog: pytest.LogCaptureFixture) -> None:
    supervisor = Supervisor(QUICK)
    runs: list[int] = []
    worker: Worker

    def loop() -> None:
        runs.append(1)
        if len(runs) > 1:
            worker.stopping.wait()

    worker = Worker("returns", loop, supervisor=supervisor)
    worker.start()
    try:
        assert wait_for(lambda: len(runs) == 2)
        (line,) = crash_lines(caplog, "returns")
        assert "returned" in str(line["error"])
    finally:
        worker.stop()
    assert supervisor.restarts() == {"returns": 1}


def test_the_test_hook_crashes_only_the_worker_its_file_names(tmp_path: Path) -> None:
    faults = tmp_path / "faults"
    supervisor = Supervisor(QUICK, faults=faults)
    workers: dict[str, Worker] = {}

    def looping(name: str) -> Callable[[], None]:
        def loop() -> None:
            while True:
                workers[name].turn()
                if workers[name].stopping.wait(0.01):
                    return

        return loop

    for name in ("hooked", "spared"):
        workers[name] = Worker(name, looping(name), supervisor=supervisor)
        workers[name].start()
    try:
        faults.write_text("hooked\n")
        assert wait_for(lambda: any("restarting in a loop" in p for p in supervisor.problems()))
        (problem,) = supervisor.problems()
        assert problem.startswith("worker hooked ") and "InjectedFault" in problem
        faults.write_text("")
        assert wait_for(lambda: supervisor.problems() == [])
        assert supervisor.restarts()["hooked"] >= 3 and supervisor.restarts()["spared"] == 0
    finally:
        for worker in workers.values():
            worker.stop()


class Fatal(BaseException):
    """Ends a thread the way no worker may catch (as SystemExit would)."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_worker_whose_thread_ended_is_reported_for_good() -> None:
    supervisor = Supervisor(QUICK)

    def loop() -> None:
        raise Fatal("the interpreter is going down")

    worker = Worker("ends", loop, supervisor=supervisor)
    worker.start()
    assert wait_for(lambda: supervisor.problems() != [])
    (problem,) = supervisor.problems()
    assert problem.startswith("worker ends has ended") and "Fatal" in problem
    worker.stop()
