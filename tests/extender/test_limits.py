"""The extender's HTTP server holds its limits against hostile clients (issue 13 F4), through real
sockets: it used to read any body up to 256 MiB whole (one 250 MB POST took it to 783 MiB against
its 512 Mi limit), start one thread per connection without a cap, and wait 120 s per read on a
slow client."""

from __future__ import annotations

import json
import socket
import threading
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deviceplugin.extender.config import DEFAULT_MAX_BODY_BYTES
from tests.extender.conftest import Running, StartExtender, memory_pod
from tests.rawhttp import HALF_SENT, closed_silently, half_open, reply, send, trickle


def address(ext: Running) -> tuple[str, int]:
    parts = urlsplit(ext.extender.url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def refusals(ext: Running) -> dict[str, float]:
    """`volcano_gpu_extender_http_refusals_total` by reason, from /metrics."""
    with send(address(ext), b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") as sock:
        answer = reply(sock)
    assert answer.status == 200
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(answer.body.decode())
        for sample in family.samples
        if sample.name == "volcano_gpu_extender_http_refusals_total"
    }


@pytest.mark.parametrize(
    "length",
    [DEFAULT_MAX_BODY_BYTES + 1, 250_000_000, 10**40],
    ids=["one byte over", "F4's 250 MB", "40 digits"],
)
def test_a_body_over_the_limit_gets_413_without_being_read(
    start_extender: StartExtender, length: int
) -> None:
    ext = start_extender(strategy="share")
    head = f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
    # No byte of the body is sent: a server that waited for it would never answer.
    with send(address(ext), head.encode()) as sock:
        answer = reply(sock)
    assert answer.status == 413
    assert f"the limit is {DEFAULT_MAX_BODY_BYTES}" in json.loads(answer.body)["Error"]
    assert refusals(ext)["body_too_large"] == 1
    assert ext.client.request("GET", "/healthz").status == 200


@pytest.mark.parametrize(
    ("name_length", "pod_bytes"),
    [(63, 256 * 1024), (253, 1536 * 1024)],
    ids=["realistic: 63-char names, 256 KiB pod", "legal maximum: 253-char names, etcd-size pod"],
)
def test_filter_for_20000_nodes_fits_the_default_body_limit(
    start_extender: StartExtender, name_length: int, pod_bytes: int
) -> None:
    """The limit's derivation (docs/extender.md, "Limits"), checked on real requests."""
    ext = start_extender(strategy="share")
    names = [f"{n:05d}-".ljust(name_length, "n") for n in range(20_000)]
    pod = memory_pod("big", 1000, annotations={"example.com/blob": "x" * pod_bytes})
    pod["metadata"]["uid"] = "u-big"
    body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
    assert len(body) <= DEFAULT_MAX_BODY_BYTES * (0.25 if name_length == 63 else 0.85)  # the margin
    answer = ext.client.request("POST", "/filter", body)
    assert answer.status == 200, answer.body
    assert len(answer.body["FailedAndUnresolvableNodes"]) == 20_000  # none of them is in the cache


def test_a_thousand_half_open_connections_take_no_thread_and_a_request_is_still_answered(
    start_extender: StartExtender,
) -> None:
    ext = start_extender(strategy="share")
    before = threading.active_count()
    with half_open(address(ext), 1000):
        # Answered after the server has taken every earlier connection off its accept queue.
        assert ext.client.request("GET", "/healthz").status == 200
        grown = threading.active_count() - before
        assert grown <= 8, f"{grown} more threads with 1,000 half-open connections"
        assert ext.extender.http.stats.open <= 512
    assert refusals(ext)["evicted"] >= 1000 - 512


def test_at_the_connection_cap_the_connection_idle_longest_makes_room(start_extender: StartExtender) -> None:
    ext = start_extender(strategy="share", max_connections=16)
    with half_open(address(ext), 16) as sockets:
        assert ext.client.request("GET", "/healthz").status == 200
        assert closed_silently(sockets[0])  # the oldest, idle since it connected
        assert refusals(ext)["evicted"] >= 1


@pytest.mark.parametrize(
    ("sent", "status"),
    [
        (b"", None),  # connected, never sent a byte: closed without a reply
        (HALF_SENT, 408),  # headers that never end
        (b'POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"Pod":', 408),  # body cut short
    ],
    ids=["silent", "headers cut short", "body cut short"],
)
def test_a_client_that_stops_sending_is_cut_off(
    start_extender: StartExtender, sent: bytes, status: int | None
) -> None:
    ext = start_extender(strategy="share", request_timeout=0.5)
    with send(address(ext), sent) as sock:
        if status is None:
            assert closed_silently(sock)
        else:
            answer = reply(sock)
            assert answer.status == status
            assert "did not arrive whole within 0.5 s" in json.loads(answer.body)["Error"]
            assert closed_silently(sock)
    assert ext.client.request("GET", "/healthz").status == 200


def test_a_client_trickling_its_headers_is_cut_off_at_the_request_time_limit(
    start_extender: StartExtender,
) -> None:
    ext = start_extender(strategy="share", request_timeout=0.5)
    answer = trickle(address(ext), b"GET /healthz HTTP/1.1\r\nX-Slow: ")
    assert answer is not None and answer.status == 408
    assert refusals(ext)["timeout"] >= 1


def test_headers_over_the_limit_get_431(start_extender: StartExtender) -> None:
    ext = start_extender(strategy="share")
    with send(address(ext), b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n") as sock:
        assert reply(sock).status == 431


def test_a_chunked_body_is_refused_with_411(start_extender: StartExtender) -> None:
    ext = start_extender(strategy="share")
    head = b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{}{}{\r\n0\r\n\r\n"
    with send(address(ext), head) as sock:
        answer = reply(sock)
    assert answer.status == 411 and "Content-Length" in json.loads(answer.body)["Error"]


def test_keep_alive_requests_and_expect_100_continue(start_extender: StartExtender) -> None:
    """kube-scheduler keeps its connection; curl asks before sending a large body."""
    ext = start_extender(strategy="share")
    pod = memory_pod("new", 1000)
    pod["metadata"]["uid"] = "u1"
    body = json.dumps({"Pod": pod, "NodeNames": []}).encode()
    with socket.create_connection(address(ext), timeout=30) as sock:
        for _ in range(3):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert reply(sock).status == 200
        head = b"POST /filter HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
        sock.sendall(head % len(body))
        assert sock.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        assert reply(sock).status == 200
