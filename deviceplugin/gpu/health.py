"""GPU health: which Xids count, the shared health state, and the monitor thread.

Differences from the NVIDIA plugin's health loop, on purpose (SPEC §6): waits are at most 1 s so a
fault is visible within a second; a failing event wait marks every GPU unhealthy (fence) instead
of silently ending health checking; and a GPU returns to Healthy once it has been quiet for the
recovery period and answers a probe.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from deviceplugin.gpu.base import GpuBackend, WaitError, XidEvent
from deviceplugin.logs import get_log
from deviceplugin.supervisor import Supervisor
from deviceplugin.worker import Worker

log = get_log(__name__)

# Application faults: the GPU is fine, the process that caused them is not (NVIDIA's list).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
WAIT_S = 0.5
FENCE_RETRY_S = 0.5


def _xid_list(value: str) -> frozenset[int]:
    """Comma-separated Xids; tokens that are not non-negative integers are ignored (NVIDIA's rule)."""
    tokens = (token.strip() for token in value.split(","))
    return frozenset(int(token) for token in tokens if token.isascii() and token.isdigit())


@dataclass(frozen=True, slots=True)
class XidPolicy:
    """Which Xids mark a GPU unhealthy, from `DP_DISABLE_HEALTHCHECKS` / `DP_ENABLE_HEALTHCHECKS`.

    Disable: `all`, or any value containing `xids`, turns Xid checks off; otherwise a list of
    Xids to ignore on top of the application Xids. Enable: `all`, or a list of Xids to act on even
    when disabled or ignored by default.
    """

    disabled_all: bool = False
    ignored: frozenset[int] = APPLICATION_XIDS
    enabled_all: bool = False
    enabled: frozenset[int] = frozenset()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> XidPolicy:
        disable = env.get("DP_DISABLE_HEALTHCHECKS", "").strip().lower()
        enable = env.get("DP_ENABLE_HEALTHCHECKS", "").strip().lower()
        return cls(
            disabled_all=disable == "all" or "xids" in disable,
            ignored=APPLICATION_XIDS | _xid_list(disable),
            enabled_all=enable == "all",
            enabled=_xid_list(enable),
        )

    @property
    def watching(self) -> bool:
        """Whether any Xid can mark a GPU unhealthy, i.e. whether to run the event thread."""
        return not self.disabled_all or self.enabled_all or bool(self.enabled)

    def acts_on(self, xid: int) -> bool:
        if self.enabled_all or xid in self.enabled:
            return True
        return not self.disabled_all and xid not in self.ignored


DRIVER = "driver"  # the default source of faults: NVML's events and probes (HealthMonitor)


class HealthState:
    """Health of every GPU (by UUID) with a version number; waiters wake on each change. Each
    source of faults (the driver's events, an MPS control daemon) marks a GPU on its own: it is
    healthy while no source holds it unhealthy, so one source's recovery never hides another's
    fault."""

    def __init__(self, uuids: tuple[str, ...]) -> None:
        self._healthy = dict.fromkeys(uuids, True)
        self._faults: dict[str, set[str]] = {uuid: set() for uuid in uuids}  # sources holding it down
        self._version = 0
        self._wakes = 0
        self._changed = threading.Condition()
        self._listeners: list[Callable[[str, bool, str], None]] = []

    def snapshot(self) -> tuple[int, dict[str, bool]]:
        with self._changed:
            return self._version, dict(self._healthy)

    def set(self, uuids: tuple[str, ...], healthy: bool, reason: str, *, source: str = DRIVER) -> None:
        """Mark GPUs as `source` sees them; bumps the version and wakes waiters only when a GPU's
        health (no source holding it down) changed."""
        with self._changed:
            for uuid in uuids:
                faults = self._faults.get(uuid)
                if faults is not None:
                    (faults.discard if healthy else faults.add)(source)
            flipped = tuple(
                u for u in uuids if u in self._healthy and self._healthy[u] != (not self._faults[u])
            )
            if not flipped:
                return
            for uuid in flipped:
                self._healthy[uuid] = healthy
            self._version += 1
            self._changed.notify_all()
            listeners = tuple(self._listeners)
        for uuid in flipped:
            log.warning("gpu health changed", gpu=uuid, healthy=healthy, reason=reason)
            for listener in listeners:
                listener(uuid, healthy, reason)

    def add_listener(self, listener: Callable[[str, bool, str], None]) -> None:
        """Call `listener(uuid, healthy, reason)` after every flip, from the flipping thread."""
        with self._changed:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[str, bool, str], None]) -> None:
        with self._changed:
            self._listeners.remove(listener)

    def wake(self) -> None:
        """Return every `wait_change` now, changed or not (so a stopping stream ends at once)."""
        with self._changed:
            self._wakes += 1
            self._changed.notify_all()

    def wait_change(self, version: int, timeout_s: float) -> int:
        """Block until the version differs from `version`, `wake` is called or the timeout passes;
        returns the current version."""
        with self._changed:
            wakes = self._wakes
            self._changed.wait_for(lambda: self._version != version or self._wakes != wakes, timeout_s)
            return self._version


@dataclass
class HealthMonitor:
    """Watches Xid events in a thread and keeps `state` current.

    Every fault records the time it was seen; a GPU marked unhealthy is probed again once nothing
    bad has been seen on it for `recovery_s`, and returns to Healthy if the probe (and, for a GPU
    whose events could not be registered, a new registration) succeeds.
    """

    backend: GpuBackend
    state: HealthState
    policy: XidPolicy
    recovery_s: float
    clock: Callable[[], float] = time.monotonic
    supervisor: Supervisor | None = None
    _uuids: tuple[str, ...] = field(init=False, default=())
    _last_fault: dict[str, float] = field(init=False, default_factory=dict)
    _unwatched: set[str] = field(init=False, default_factory=set)
    # Xid events seen, acted on or not, by (GPU UUID or "unknown", Xid): for the metrics
    xid_events: Counter[tuple[str, int]] = field(init=False, default_factory=Counter)
    _worker: Worker = field(init=False)

    def __post_init__(self) -> None:
        self._uuids = tuple(self.state.snapshot()[1])
        self._worker = Worker("gpu-health", self._run, supervisor=self.supervisor)

    def start(self) -> None:
        if not self.policy.watching:
            log.warning("xid health checks disabled by DP_DISABLE_HEALTHCHECKS")
            return
        for uuid, problem in self.backend.watch(self._uuids).items():
            self._fault((uuid,), f"cannot watch Xid events: {problem}")
            self._unwatched.add(uuid)
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def _fault(self, uuids: tuple[str, ...], reason: str) -> None:
        now = self.clock()
        for uuid in uuids:
            self._last_fault[uuid] = now
        self.state.set(uuids, healthy=False, reason=reason)

    def handle(self, event: XidEvent) -> None:
        """Apply one Xid event (public so the fence/recovery logic can be driven directly)."""
        self.xid_events[(event.uuid or "unknown", event.xid)] += 1
        if not self.policy.acts_on(event.xid):
            log.info("xid ignored", xid=event.xid, gpu=event.uuid)
            return
        if event.uuid is None:
            self._fault(self._uuids, f"Xid {event.xid} on an unidentified GPU")
        elif event.uuid in self._uuids:
            self._fault((event.uuid,), f"Xid {event.xid}")
        else:
            log.debug("xid for a GPU not managed here", xid=event.xid, gpu=event.uuid)

    def recover_due(self) -> None:
        """Return quiet GPUs to Healthy when they answer a probe."""
        now = self.clock()
        _, health = self.state.snapshot()
        for uuid, healthy in health.items():
            if healthy or now - self._last_fault.get(uuid, now) < self.recovery_s:
                continue
            if uuid in self._unwatched:
                if self.backend.watch((uuid,)):
                    self._last_fault[uuid] = now
                    continue
                self._unwatched.discard(uuid)
            if self.backend.probe(uuid):
                reason = f"quiet for {self.recovery_s:g}s and probe passed"
                self.state.set((uuid,), healthy=True, reason=reason)
            else:
                self._last_fault[uuid] = now
                log.info("gpu still unhealthy: probe failed", gpu=uuid, retry_s=self.recovery_s)

    def _run(self) -> None:
        while not self._worker.stopping.is_set():
            try:
                event = self.backend.wait_event(WAIT_S)
            except WaitError as err:
                self._fault(self._uuids, f"event wait failed: {err}")
                self._worker.stopping.wait(FENCE_RETRY_S)
                continue
            if event is not None:
                self.handle(event)
            self.recover_due()
            self._worker.turn()
