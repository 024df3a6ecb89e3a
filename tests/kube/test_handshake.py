"""The vGPU handshake against the API-server emulator over HTTP: the daemon's node watch and
`Handshake`, with Volcano's side played by `tests.volcano_handshake`."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterator

import pytest

from deviceplugin.fit import keys
from deviceplugin.kube.api import Kube
from deviceplugin.kube.handshake import Handshake, Value, classify, reported
from deviceplugin.kube.node import NodeWatch
from kubesim.apiserver import ApiServerEmulator
from tests.kube.objects import node_object
from tests.kube.waiting import WAIT_S, wait_for
from tests.volcano_handshake import VolcanoHandshake, stamp

NODE_PATH = "/api/v1/nodes/node-a"
NOW = datetime.datetime(2026, 3, 1, 8, 30, 5)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, Value.ABSENT),
        ("Requesting_2026.03.01 08:30:05", Value.REQUEST),
        ("Deleted_2026.03.01 08:30:05", Value.DELETED),
        ("Reported 2026-03-01 08:30:05.123 +0000 UTC", Value.REPORTED),
        ("Reported 2026-03-01 08:30:05.123 +0800 CST m=+12.5", Value.REPORTED),  # HAMi's time.String()
        ("Requesting_tomorrow", Value.BAD),
        ("Requesting_2026-03-01 08:30:05", Value.BAD),  # not Volcano's layout
        ("Requesting_2026.13.01 08:30:05", Value.BAD),  # no month 13
        ("Requesting", Value.REQUEST),  # malformed: Volcano indexes past the end of its split
        ("xRequesting_2026.03.01 08:30:05", Value.BAD),
        ("Deleted", Value.DELETED),  # malformed, yet Volcano drops the node for it
        ("Deleted_2026-03-01 08:30:05", Value.DELETED),
        ("Reported", Value.BAD),
        ("ok", Value.BAD),
        ("", Value.BAD),
    ],
)
def test_values_are_read_as_volcano_writes_them(value: str | None, kind: Value) -> None:
    found, why = classify(value)
    assert found is kind
    malformed = kind is Value.BAD or value in ("Requesting", "Deleted", "Deleted_2026-03-01 08:30:05")
    assert bool(why) == malformed  # said for every value the protocol never writes


def test_the_answer_is_reported_and_the_time() -> None:
    assert reported(NOW.replace(tzinfo=datetime.UTC)) == "Reported 2026-03-01 08:30:05.000000 +0000 UTC"


@pytest.fixture
def watch(apiserver: ApiServerEmulator, kube: Kube) -> Iterator[NodeWatch]:
    apiserver.create("nodes", node_object("node-a"))
    node = NodeWatch(kube, "node-a")
    node.start()
    assert node.wait_synced(WAIT_S)
    yield node
    node.stop()


def handshake_value(apiserver: ApiServerEmulator) -> str | None:
    node = apiserver.get("nodes", "node-a") or {}
    return (node.get("metadata", {}).get("annotations") or {}).get(keys.NODE_VGPU_HANDSHAKE)


def set_value(apiserver: ApiServerEmulator, watch: NodeWatch, value: str | None) -> None:
    """Write the annotation as someone else would, and wait until the watch has seen it."""
    apiserver.patch("nodes", "node-a", {"metadata": {"annotations": {keys.NODE_VGPU_HANDSHAKE: value}}})

    def seen(cache: NodeWatch) -> bool:
        node = cache.node() or {}
        return (node.get("metadata", {}).get("annotations") or {}).get(keys.NODE_VGPU_HANDSHAKE) == value

    assert watch.wait_until(seen, WAIT_S)


def writes(apiserver: ApiServerEmulator) -> int:
    return apiserver.requests.count(method="PATCH", path=NODE_PATH)


def test_a_missing_annotation_is_seeded_once(
    apiserver: ApiServerEmulator, kube: Kube, watch: NodeWatch
) -> None:
    handshake = Handshake(kube, watch, 30)
    assert handshake.step() is None  # written; nothing more to do until the node changes
    value = handshake_value(apiserver)
    assert value is not None and classify(value)[0] is Value.REPORTED
    for _ in range(3):
        assert handshake.step() is None  # whether or not the watch shows the answer yet
    assert writes(apiserver) == 1


def test_started_before_its_watch_as_the_daemon_does(apiserver: ApiServerEmulator, kube: Kube) -> None:
    apiserver.create("nodes", node_object("node-a"))
    watch = NodeWatch(kube, "node-a")
    handshake = Handshake(kube, watch, 30)
    handshake.start()
    watch.start()
    try:
        assert wait_for(lambda: classify(handshake_value(apiserver))[0] is Value.REPORTED)
    finally:
        watch.stop()
        handshake.stop()


def test_each_request_is_answered_once_and_not_before_the_interval(
    apiserver: ApiServerEmulator, kube: Kube, watch: NodeWatch
) -> None:
    handshake = Handshake(kube, watch, 30)
    handshake.step()  # the seed
    set_value(apiserver, watch, stamp("Requesting", datetime.datetime.now()))
    wait = handshake.step()
    assert wait is not None and 0 < wait <= 30  # Volcano would ask again at once: the answer waits
    assert writes(apiserver) == 1

    fresh = Handshake(kube, watch, 30)  # a restarted daemon does not know how long it has waited
    assert fresh.step() is None
    assert classify(handshake_value(apiserver))[0] is Value.REPORTED
    assert fresh.step() is None
    assert writes(apiserver) == 2


def test_a_dropped_node_is_revived(apiserver: ApiServerEmulator, kube: Kube, watch: NodeWatch) -> None:
    set_value(apiserver, watch, stamp("Deleted", datetime.datetime.now()))
    assert Handshake(kube, watch, 30).step() is None
    assert classify(handshake_value(apiserver))[0] is Value.REPORTED


@pytest.mark.parametrize("value", ["Requesting_tomorrow", "ok", "Reported 2026-03-01 08:30:05 +0000 UTC"])
def test_values_not_to_answer_are_left_alone(
    apiserver: ApiServerEmulator, kube: Kube, watch: NodeWatch, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    set_value(apiserver, watch, value)
    handshake = Handshake(kube, watch, 0.01)
    with caplog.at_level(logging.WARNING, logger="deviceplugin.kube.handshake"):
        for _ in range(3):
            assert handshake.step() is None
    assert handshake_value(apiserver) == value
    assert writes(apiserver) == 0
    warnings = [
        r.__dict__["fields"] for r in caplog.records if r.getMessage() == "handshake value left alone"
    ]
    if classify(value)[0] is Value.BAD:
        assert len(warnings) == 1  # once per value, naming the annotation, the value and why
        assert warnings[0]["annotation"] == keys.NODE_VGPU_HANDSHAKE and warnings[0]["value"] == value
        assert warnings[0]["reason"]
    else:
        assert warnings == []


@pytest.mark.parametrize("value", ["Deleted", "Deleted_yesterday", "Requesting"])
def test_a_malformed_value_volcano_cannot_get_past_is_answered(
    apiserver: ApiServerEmulator, kube: Kube, watch: NodeWatch, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Volcano drops the node for any value holding `Deleted` but not `Requesting`, and never writes
    over it; a `Requesting` without `_` makes its scheduler panic. Only an answer gets past either."""
    set_value(apiserver, watch, value)
    volcano = VolcanoHandshake(apiserver, "node-a")
    if "Requesting" in value:
        with pytest.raises(IndexError):
            volcano.session()
    else:
        assert volcano.session() is False
    with caplog.at_level(logging.WARNING, logger="deviceplugin.kube.handshake"):
        assert Handshake(kube, watch, 30).step() is None
    assert classify(handshake_value(apiserver))[0] is Value.REPORTED
    assert volcano.session() is True
    replaced = [r.__dict__["fields"] for r in caplog.records if r.getMessage() == "handshake value replaced"]
    (warning,) = replaced  # once, naming the value and why
    assert warning["value"] == value and warning["reason"]


def test_volcano_keeps_the_node_with_one_answer_per_request(
    apiserver: ApiServerEmulator, kube: Kube, watch: NodeWatch
) -> None:
    handshake = Handshake(kube, watch, 0.2)
    volcano = VolcanoHandshake(apiserver, "node-a")
    handshake.start()
    volcano.start()
    try:
        assert wait_for(lambda: volcano.requests >= 4)  # seed, then Volcano asks and the daemon answers
    finally:
        volcano.stop()
    assert wait_for(lambda: classify(handshake_value(apiserver))[0] is Value.REPORTED)  # the last one too
    handshake.stop()
    assert writes(apiserver) == 1 + volcano.requests  # the seed and one answer per request
    assert volcano.deleted == 0


def test_heartbeat_writes_whatever_the_node_holds(
    apiserver: ApiServerEmulator, kube: Kube, watch: NodeWatch
) -> None:
    set_value(apiserver, watch, "Reported 2026-03-01 08:30:05 +0000 UTC")
    handshake = Handshake(kube, watch, 0.05, heartbeat=True)
    handshake.start()
    try:
        assert wait_for(lambda: handshake.writes >= 3)
    finally:
        handshake.stop()
