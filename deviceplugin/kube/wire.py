"""One HTTP/1.1 request and its answer, on a keep-alive connection of the API client's pool.

urllib3's request path (PoolManager, HTTPConnectionPool.urlopen, http.client) costs ~240 µs of
CPU for one small PATCH, most of it in http.client's header parsing (the email package) and in
urllib3's response and retry objects; the outbox sends a PATCH or two per Allocate, so that was
more CPU than the Allocate itself (bench/outbox.py --profile). Here a request is one write of
bytes built at once and the answer is parsed from the bytes read (~50 µs). The connections are
still the pool's: urllib3 opens them (TLS as the client configured it) and drops one the server
closed while it was idle. Only what an API server's answers need is read: a body by
Content-Length, chunked or up to the close; no compression is asked for, so none comes.
"""

from __future__ import annotations

import socket
from typing import NamedTuple

import urllib3
from urllib3.exceptions import ProtocolError

MAX_HEAD = 64 * 1024  # an answer's status line and headers; an API server's are a few hundred bytes
READ_SIZE = 64 * 1024
NO_BODY = frozenset({204, 304})


class Answer(NamedTuple):
    status: int
    reason: str
    data: bytes


class _Reader:
    """Reads an answer from a socket through one buffer."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self.closed = False  # the server closed the connection

    def _fill(self) -> None:
        chunk = self._sock.recv(READ_SIZE)
        if not chunk:
            self.closed = True
            raise ProtocolError("the connection closed before the whole answer came")
        self._buffer += chunk

    def until(self, mark: bytes, limit: int) -> bytes:
        """The bytes up to `mark` (taken, the mark too, not returned)."""
        while (end := self._buffer.find(mark)) < 0:
            if len(self._buffer) > limit:
                raise ProtocolError("an answer's head or chunk line is too long")
            self._fill()
        taken = bytes(self._buffer[:end])
        del self._buffer[: end + len(mark)]
        return taken

    def exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._fill()
        taken = bytes(self._buffer[:size])
        del self._buffer[:size]
        return taken

    def to_close(self) -> bytes:
        while not self.closed:
            chunk = self._sock.recv(READ_SIZE)
            if not chunk:
                self.closed = True
            self._buffer += chunk
        return bytes(self._buffer)

    def chunked(self) -> bytes:
        body = bytearray()
        while size := int(self.until(b"\r\n", MAX_HEAD).split(b";", 1)[0], 16):
            body += self.exactly(size)
            if self.exactly(2) != b"\r\n":
                raise ProtocolError("a chunk does not end with CRLF")
        while self.until(b"\r\n", MAX_HEAD):  # trailers, up to the empty line
            pass
        return bytes(body)


def _field(fields: bytes, name: bytes) -> str | None:
    """A header's value from the lower-cased header lines (each after a CRLF); the first if repeated."""
    start = fields.find(b"\r\n" + name + b":")
    if start < 0:
        return None
    start += len(name) + 3
    end = fields.find(b"\r\n", start)
    return fields[start : None if end < 0 else end].strip().decode("latin-1")


def _answer(reader: _Reader, method: str) -> tuple[Answer, bool]:
    """The answer, and whether the connection may carry another request."""
    while True:
        status_line, _, fields = reader.until(b"\r\n\r\n", MAX_HEAD).partition(b"\r\n")
        version, _, rest = status_line.decode("latin-1").partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/") or not code.isdigit():
            raise ProtocolError(f"not an HTTP answer: {status_line[:80]!r}")
        status = int(code)
        if status >= 200:
            break  # 1xx interim answers (100 Continue) precede the answer
    fields = b"\r\n" + fields.lower()  # only the few fields read are looked for, not all parsed
    keep = version == "HTTP/1.1" and _field(fields, b"connection") != "close"
    length = _field(fields, b"content-length")
    if status in NO_BODY or method == "HEAD":
        data = b""
    elif "chunked" in (_field(fields, b"transfer-encoding") or ""):
        data = reader.chunked()
    elif length is not None:
        if not length.isdigit():
            raise ProtocolError(f"a bad Content-Length: {length!r}")
        data = reader.exactly(int(length))
    else:
        data, keep = reader.to_close(), False
    return Answer(status, reason, data), keep and not reader.closed


def exchange(
    pool: urllib3.HTTPConnectionPool, method: str, request: bytes, timeout: urllib3.Timeout
) -> Answer:
    """Send `request` (the request line, headers and body, as bytes) on a connection of `pool`
    and read the answer. The connection goes back to the pool, closed unless the answer leaves it
    reusable. Raises OSError or urllib3's ProtocolError when no whole answer came."""
    conn = pool._get_conn()  # the pool's queue: its connections, reused and bounded
    reusable = False
    try:
        if conn.sock is None:  # type: ignore[attr-defined]  # http.client's socket, None until connected
            conn.timeout = urllib3.Timeout.resolve_default_timeout(timeout.connect_timeout)
            conn.connect()
        sock: socket.socket = conn.sock  # type: ignore[attr-defined]
        sock.settimeout(timeout.read_timeout)
        sock.sendall(request)
        answer, reusable = _answer(_Reader(sock), method)
        return answer
    finally:
        if not reusable:
            conn.close()
        pool._put_conn(conn)
