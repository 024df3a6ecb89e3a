"""The `volcano.sh/node-vgpu-handshake` that Volcano v1.8.0 to v1.13.3, v1.14.0 to v1.14.2 and
v1.15.0 require (vgpu strategy; docs/deploy.md, "Volcano's vGPU handshake", has the details).

Those schedulers rebuild a node's devices every scheduling session: a node without the annotation,
or with `Deleted_<time>`, has no vGPUs; any other value that is not a request makes the scheduler
write `Requesting_<its time, 2006.01.02 15:04:05>`, and a request left unanswered for 60 s turns
into `Deleted_<time>`. The plugin answers by writing `Reported <its time>`.

By default the daemon answers what it sees on its node watch, once per value: it seeds a missing
annotation, revives `Deleted_`, and answers each `Requesting_`, never sooner than `interval_s`
(minus up to 20 % jitter) after its previous answer. Answering at once would not do: the scheduler
requests again in its next session (every second), so the pair would write to the node every
second; waiting keeps it to one round per interval while staying inside the 60 s. Newer Volcano
never writes a request, so there the daemon writes once (the seed) and never again. Values this
protocol never produces are logged once and answered only where Volcano cannot get past them
(`classify`). `heartbeat=True` instead writes `Reported`
every `interval_s` whatever the node holds, as the HAMi plugin up to v1.12 did.
"""

from __future__ import annotations

import datetime
import random
import re
import threading
import time
from collections.abc import Callable
from enum import Enum

from deviceplugin.fit import keys
from deviceplugin.kube.api import ApiError, Kube, Obj
from deviceplugin.kube.node import NodeWatch
from deviceplugin.logs import get_log
from deviceplugin.supervisor import Supervisor
from deviceplugin.worker import Worker

log = get_log(__name__)

JITTER = 0.2
RETRY_S = 5.0
# Volcano writes and parses its times with Go's layout `2006.01.02 15:04:05`.
_STAMP = re.compile(r"(Requesting|Deleted)_(\d{4}\.\d{2}\.\d{2} \d{2}:\d{2}:\d{2})")
_LAYOUT = "%Y.%m.%d %H:%M:%S"


class Value(Enum):
    ABSENT = "absent"  # no annotation: Volcano ignores the node's vGPUs
    REQUEST = "request"  # Volcano asks; unanswered for 60 s the node is dropped
    DELETED = "deleted"  # Volcano dropped the node
    REPORTED = "reported"  # answered; Volcano will ask again
    BAD = "bad"  # not a value of the protocol


ANSWERED = frozenset({Value.ABSENT, Value.REQUEST, Value.DELETED})


def classify(value: str | None) -> tuple[Value, str]:
    """What a handshake value means to Volcano, and for one the protocol never writes why. Volcano
    matches `Requesting` and `Deleted` anywhere in the value. A malformed request is left to it (it
    reads an unparsable time as expired and writes `Deleted_`), except one without `_`, on which its
    split panics; any value with `Deleted` but no `Requesting` drops the node until answered."""
    if value is None:
        return Value.ABSENT, ""
    if "Requesting" in value or "Deleted" in value:
        stamp = _STAMP.fullmatch(value)
        why = "not Requesting_ or Deleted_ followed by a time in Volcano's layout"
        if stamp is not None:
            try:
                datetime.datetime.strptime(stamp.group(2), _LAYOUT)
            except ValueError:
                why = f"{stamp.group(2)!r} is not a valid time"
            else:
                return (Value.REQUEST if stamp.group(1) == "Requesting" else Value.DELETED), ""
        if "Requesting" not in value:
            return Value.DELETED, why
        if "_" not in value:
            return Value.REQUEST, f"{why}; Volcano's scheduler panics on a request without '_'"
        return Value.BAD, why
    if value.startswith("Reported "):
        return Value.REPORTED, ""
    return Value.BAD, "neither Reported <time>, Requesting_<time> nor Deleted_<time>"


def reported(now: datetime.datetime) -> str:
    """`Reported ` + the time in the layout of Go's `time.Time.String()` (UTC)."""
    return f"Reported {now.astimezone(datetime.UTC):%Y-%m-%d %H:%M:%S.%f} +0000 UTC"


def _value(node: Obj) -> str | None:
    annotations = node.get("metadata", {}).get("annotations") or {}
    value = annotations.get(keys.NODE_VGPU_HANDSHAKE)
    return None if value is None else str(value)


class Handshake:
    def __init__(
        self,
        kube: Kube,
        watch: NodeWatch,
        interval_s: float,
        *,
        heartbeat: bool = False,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        supervisor: Supervisor | None = None,
    ) -> None:
        self.kube = kube
        self.watch = watch
        self.node_name = watch.name
        self.interval_s = interval_s
        self.heartbeat = heartbeat
        self.clock = clock
        self.writes = 0
        self._last_write: float | None = None  # time.monotonic() of the last answer
        self._delay = self._jittered()
        # Between an answer and the watch event that shows it, the cache shows the node as it was
        # before: `_replaced` is not answered again while `_pending` is not seen.
        self._lock = threading.Lock()
        self._pending: str | None = None
        self._replaced: str | None = None
        self._warned: str | None = None
        self._kick = threading.Event()
        self._worker = Worker("vgpu-handshake", self._run, interrupt=self._kick.set, supervisor=supervisor)
        watch.add_listener(self._on_node)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def _jittered(self) -> float:
        # Only downwards: the interval is the most the scheduler waits for an answer after our last.
        return self.interval_s * random.uniform(1 - JITTER, 1)

    def _on_node(self, _kind: str, node: Obj) -> None:
        # Every event, in order, from the watch's thread: a step may only see the latest.
        with self._lock:
            if self._pending is not None and _value(node) == self._pending:
                self._pending = None
        self._kick.set()

    def _needs_answer(self) -> bool:
        if self.heartbeat:
            return True
        node = self.watch.node()
        if node is None:
            return False  # not listed yet: the watch's first list kicks us
        value = _value(node)
        with self._lock:
            if self._pending is not None:
                if value == self._replaced:
                    return False  # the cache is behind our last answer
                self._pending = None  # changed since by someone else (or a relist skipped ours)
        kind, why = classify(value)
        if why and value != self._warned:
            self._warned = value
            log.warning(
                "handshake value left alone" if kind is Value.BAD else "handshake value replaced",
                node=self.node_name,
                annotation=keys.NODE_VGPU_HANDSHAKE,
                value=value,
                reason=why,
            )
        return kind in ANSWERED

    def step(self) -> float | None:
        """Answer if due; returns how long to wait before the next step (None: until the node changes)."""
        if not self._needs_answer():
            return None
        if self._last_write is not None:
            left = self._last_write + self._delay - time.monotonic()
            if left > 0:
                return left
        node = self.watch.node()
        answer = reported(self.clock())
        with self._lock:  # before the write: its event may arrive before the call returns
            self._pending, self._replaced = answer, None if node is None else _value(node)
        try:
            self.kube.patch_node(
                self.node_name, {"metadata": {"annotations": {keys.NODE_VGPU_HANDSHAKE: answer}}}
            )
        except Exception as err:
            with self._lock:  # not written, however it failed: a crash too must leave it to answer
                self._pending = None
            if not isinstance(err, ApiError):
                raise  # for the supervisor
            log.warning("handshake write failed", node=self.node_name, error=str(err))
            return min(RETRY_S, self.interval_s)
        self.writes += 1
        self._last_write, self._delay = time.monotonic(), self._jittered()
        log.debug("handshake answered", node=self.node_name, was=self._replaced or "(absent)", now=answer)
        return self._delay if self.heartbeat else None

    def _run(self) -> None:
        while not self._worker.stopping.is_set():
            self._kick.clear()  # before the step: a kick during it is not lost
            delay = self.step()
            self._worker.turn()
            self._kick.wait(delay)
