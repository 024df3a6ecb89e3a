"""Hostile HTTP clients on raw sockets, for the servers' limits (issue 13 F4): requests cut short,
half-open connections, headers trickled a byte at a time."""

from __future__ import annotations

import http.client
import select
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

WAIT_S = 30.0  # how long a client waits for the server's answer before the test fails
HALF_SENT = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"  # headers never end


@dataclass
class Reply:
    status: int
    body: bytes


def reply(sock: socket.socket) -> Reply:
    """The server's answer to what was sent on `sock` (waits up to WAIT_S for it)."""
    sock.settimeout(WAIT_S)
    response = http.client.HTTPResponse(sock)
    response.begin()
    return Reply(response.status, response.read())


def send(address: tuple[str, int], data: bytes) -> socket.socket:
    sock = socket.create_connection(address, timeout=WAIT_S)
    sock.sendall(data)
    return sock


def closed_silently(sock: socket.socket) -> bool:
    """True when the server closes the connection without sending anything (waits up to WAIT_S)."""
    sock.settimeout(WAIT_S)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@contextmanager
def half_open(address: tuple[str, int], count: int) -> Iterator[list[socket.socket]]:
    """`count` connections left open: every other one idle, the rest stopped inside their headers."""
    sockets: list[socket.socket] = []
    try:
        for n in range(count):
            sockets.append(send(address, HALF_SENT if n % 2 else b""))
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def trickle(address: tuple[str, int], head: bytes, gap_s: float = 0.05) -> Reply | None:
    """Send `head`, then one more header byte every `gap_s` (a slow client, not a pause of the
    test's) until the server answers or closes; its reply, None when it closed without one."""
    with send(address, head) as sock:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            readable, _, _ = select.select([sock], [], [], gap_s)
            if readable:
                break
            try:
                sock.sendall(b"a")
            except OSError:
                break  # closed: the reply, if any, is waiting to be read
        else:
            raise AssertionError(f"the server took a byte every {gap_s} s for {WAIT_S} s")
        try:
            return reply(sock)
        except (http.client.RemoteDisconnected, ConnectionResetError):
            return None
