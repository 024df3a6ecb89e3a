"""Health: Xid policy from the environment, the monitor's fault/fence/recovery rules (SPEC §6)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from deviceplugin.gpu.base import XidEvent
from deviceplugin.gpu.fake import FakeBackend
from deviceplugin.gpu.health import APPLICATION_XIDS, HealthMonitor, HealthState, XidPolicy
from tests.kube.waiting import WAIT_S, wait_for


@pytest.mark.parametrize(
    ("disable", "enable", "watching", "acts_on", "ignores"),
    [
        ("", "", True, {79, 48, 63, 0, 555}, APPLICATION_XIDS),
        ("all", "", False, set(), {79, 13, 555}),
        ("ALL", "", False, set(), {79}),
        ("xids", "", False, set(), {79}),
        ("foo,xids", "", False, set(), {79}),
        ("48, 63 ,", "", True, {79}, {48, 63, 13}),
        ("48,not-a-number,-5", "", True, {79, 5}, {48}),
        ("", "all", True, {13, 31, 43, 45, 68, 109, 79}, set()),
        ("", "31", True, {31, 79}, {13, 43}),
        ("48", "48", True, {48}, set()),  # enable overrides disable
        ("all", "79", True, {79}, {48, 13}),  # single Xids can be picked while all are disabled
        ("all", "all", True, {79, 13}, set()),
    ],
)
def test_xid_policy_from_environment(
    disable: str, enable: str, watching: bool, acts_on: set[int], ignores: set[int]
) -> None:
    policy = XidPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": disable, "DP_ENABLE_HEALTHCHECKS": enable})
    assert policy.watching is watching
    assert {xid for xid in acts_on if policy.acts_on(xid)} == acts_on
    assert {xid for xid in ignores if policy.acts_on(xid)} == set()


def test_default_policy_without_variables() -> None:
    policy = XidPolicy.from_env({})
    assert policy.watching
    assert [policy.acts_on(x) for x in (13, 31, 43, 45, 68, 109)] == [False] * 6
    assert policy.acts_on(79)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake() -> Iterator[FakeBackend]:
    backend = FakeBackend.from_spec("3x1000")
    yield backend
    backend.close()


def monitor_for(backend: FakeBackend, clock: Clock, recovery_s: float = 30.0) -> HealthMonitor:
    uuids = tuple(g.uuid for g in backend.inventory().gpus)
    return HealthMonitor(backend, HealthState(uuids), XidPolicy(), recovery_s, clock=clock)


def healthy_flags(monitor: HealthMonitor) -> list[bool]:
    return list(monitor.state.snapshot()[1].values())


def test_critical_xid_marks_only_that_gpu(fake: FakeBackend) -> None:
    monitor = monitor_for(fake, Clock())
    uuid = list(monitor.state.snapshot()[1])[1]
    version = monitor.state.snapshot()[0]
    monitor.handle(XidEvent(uuid, 79))
    assert healthy_flags(monitor) == [True, False, True]
    assert monitor.state.snapshot()[0] == version + 1


def test_application_xid_changes_nothing(fake: FakeBackend) -> None:
    monitor = monitor_for(fake, Clock())
    version = monitor.state.snapshot()[0]
    for xid in sorted(APPLICATION_XIDS):
        monitor.handle(XidEvent(next(iter(monitor.state.snapshot()[1])), xid))
    assert healthy_flags(monitor) == [True, True, True]
    assert monitor.state.snapshot()[0] == version


def test_unidentified_gpu_fences_all_and_unknown_gpu_is_ignored(fake: FakeBackend) -> None:
    monitor = monitor_for(fake, Clock())
    monitor.handle(XidEvent("GPU-not-on-this-node", 79))
    assert healthy_flags(monitor) == [True, True, True]
    monitor.handle(XidEvent(None, 79))
    assert healthy_flags(monitor) == [False, False, False]


def test_recovery_needs_the_quiet_period_and_a_passing_probe(fake: FakeBackend) -> None:
    clock = Clock()
    monitor = monitor_for(fake, clock, recovery_s=30)
    uuid = next(iter(monitor.state.snapshot()[1]))
    monitor.handle(XidEvent(uuid, 79))
    clock.now += 29
    monitor.recover_due()
    assert not monitor.state.snapshot()[1][uuid]  # not quiet long enough
    monitor.handle(XidEvent(uuid, 79))  # a new fault restarts the quiet period
    clock.now += 29
    monitor.recover_due()
    assert not monitor.state.snapshot()[1][uuid]
    fake.set_lost(uuid, True)
    clock.now += 2
    monitor.recover_due()
    assert not monitor.state.snapshot()[1][uuid]  # quiet, but the probe fails
    fake.set_lost(uuid, False)
    clock.now += 29
    monitor.recover_due()
    assert not monitor.state.snapshot()[1][uuid]  # a failed probe also restarts the period
    clock.now += 1
    monitor.recover_due()
    assert monitor.state.snapshot()[1][uuid]


def test_monitor_thread_sees_an_injected_xid_promptly(fake: FakeBackend) -> None:
    monitor = monitor_for(fake, Clock())
    monitor.start()
    try:
        uuid = list(monitor.state.snapshot()[1])[2]
        version = monitor.state.snapshot()[0]
        woke = threading.Event()

        def waiter() -> None:
            monitor.state.wait_change(version, 3600)  # returns on the change, not at the end
            woke.set()

        threading.Thread(target=waiter, daemon=True).start()
        fake.inject_xid(uuid, 79)
        assert woke.wait(WAIT_S)
        assert healthy_flags(monitor) == [True, True, False]
    finally:
        monitor.stop()


def test_failed_wait_fences_every_gpu_then_they_recover(fake: FakeBackend) -> None:
    monitor = monitor_for(fake, Clock(), recovery_s=30)
    monitor.clock = time.monotonic
    monitor.recovery_s = 0.3
    monitor.start()
    try:
        fake.inject_wait_error("GPU is lost")
        assert wait_for(lambda: healthy_flags(monitor) == [False, False, False])
        assert wait_for(lambda: healthy_flags(monitor) == [True, True, True])
    finally:
        monitor.stop()


def test_gpu_whose_events_cannot_be_registered_starts_unhealthy() -> None:
    class Unwatchable(FakeBackend):
        refuse = True

        def watch(self, uuids: tuple[str, ...]) -> dict[str, str]:
            super().watch(uuids)
            return {uuids[0]: "Unknown Error"} if self.refuse else {}

    backend = Unwatchable(FakeBackend.from_spec("2x100").inventory())
    clock = Clock()
    monitor = monitor_for(backend, clock, recovery_s=10)
    monitor.start()
    try:
        assert healthy_flags(monitor) == [False, True]
        clock.now += 11
        monitor.recover_due()
        assert healthy_flags(monitor) == [False, True]  # still cannot be watched
        backend.refuse = False
        clock.now += 11
        monitor.recover_due()
        assert healthy_flags(monitor) == [True, True]
    finally:
        monitor.stop()
        backend.close()


def test_disabled_checks_start_no_thread(fake: FakeBackend) -> None:
    uuids = tuple(g.uuid for g in fake.inventory().gpus)
    monitor = HealthMonitor(
        fake, HealthState(uuids), XidPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": "all"}), 1.0
    )
    monitor.start()
    fake.inject_xid(uuids[0], 79)
    assert "gpu-health" not in {thread.name for thread in threading.enumerate()}
    assert healthy_flags(monitor) == [True, True, True]
    monitor.stop()


def test_wake_returns_a_waiter_without_a_change() -> None:
    state = HealthState(("GPU-a",))
    version = state.snapshot()[0]
    returned = threading.Event()

    def waiter() -> None:
        state.wait_change(version, 3600)
        returned.set()

    def woken() -> bool:  # a wake before the waiter waits is not its wake-up: wake until it returns
        state.wake()
        return returned.is_set()

    threading.Thread(target=waiter, daemon=True).start()
    assert wait_for(woken)  # long before its hour
    assert state.snapshot()[0] == version


def test_one_sources_recovery_does_not_hide_anothers_fault() -> None:
    """An MPS control daemon coming back does not make a GPU the driver reported faulty healthy,
    nor does the driver's recovery hide a control daemon that is still down."""
    state = HealthState(("GPU-a",))
    flips: list[tuple[bool, str]] = []
    state.add_listener(lambda _uuid, healthy, reason: flips.append((healthy, reason)))
    state.set(("GPU-a",), False, "Xid 79")
    state.set(("GPU-a",), False, "control daemon down", source="mps")
    state.set(("GPU-a",), True, "control daemon answers", source="mps")
    assert state.snapshot()[1] == {"GPU-a": False}  # the Xid still holds it
    state.set(("GPU-a",), False, "control daemon down", source="mps")
    state.set(("GPU-a",), True, "probe passed")
    assert state.snapshot()[1] == {"GPU-a": False}  # the control daemon still does
    state.set(("GPU-a",), True, "control daemon answers", source="mps")
    assert state.snapshot()[1] == {"GPU-a": True}
    assert flips == [(False, "Xid 79"), (True, "control daemon answers")]
