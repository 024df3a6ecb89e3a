"""The background-loop helper every daemon part runs on."""

from __future__ import annotations

import queue
import threading

from deviceplugin.worker import Worker


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
