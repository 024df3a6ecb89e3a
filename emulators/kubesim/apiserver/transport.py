"""HTTP/1.1 plumbing: a threading server that can end every connection it has, and the request handler
(faults first, then the API, then the request log). Normal replies carry Content-Length; watches are
chunked, one JSON event per chunk."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from deviceplugin.logs import get_log
from kubesim.apiserver import errors
from kubesim.apiserver.api import Api, Reply, Request, Stream, is_watch
from kubesim.apiserver.body import read_body
from kubesim.apiserver.errors import ApiError
from kubesim.apiserver.faults import ErrorReply, FaultInjector, Garbled, Hang, Latency
from kubesim.apiserver.requestlog import RequestLog, RequestRecord
from kubesim.apiserver.watch import WatchDropped

log = get_log(__name__)


class _Unanswered(Exception):
    """The server began stopping while a fault held the request: close without an answer."""


class HttpServer(ThreadingHTTPServer):
    """Handler threads are joined on close; `close_connections` unblocks the ones idling in keep-alive."""

    daemon_threads = True
    block_on_close = True

    def __init__(
        self, address: tuple[str, int], api: Api, faults: FaultInjector, requests: RequestLog
    ) -> None:
        super().__init__(address, _Handler)
        self.api = api
        self.faults = faults
        self.requests = requests
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._closing = False
        self.dropped = 0  # connections their client reset mid-request

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone mid-request (kubectl interrupted, a watch cut) is not the server's error:
        counted, not printed over the user's terminal; anything else keeps the traceback."""
        if isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            with self._connections_lock:
                self.dropped += 1
            return
        super().handle_error(request, client_address)

    def finish_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            if self._closing:
                _cut(request)
            self._connections.add(request)
        try:
            super().finish_request(request, client_address)
        finally:
            with self._connections_lock:
                self._connections.discard(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            self._closing = True
            for connection in self._connections:
                _cut(connection)


def _cut(connection: socket.socket) -> None:
    """End a connection at once: no more bytes either way (a watch ends without its final chunk)."""
    with contextlib.suppress(OSError):  # already gone
        connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, the body waits for the client's
    # delayed ACK (about 40 ms a reply).
    disable_nagle_algorithm = True
    server: HttpServer

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are recorded in the request log instead."""

    def _serve(self) -> None:
        started_at, started = time.time(), time.monotonic()
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        watch = is_watch(url.path, query)
        code = 0
        recorded = False

        def record() -> None:
            nonlocal recorded
            if not recorded:
                recorded = True
                duration = time.monotonic() - started
                entry = RequestRecord(self.command, url.path, url.query, code, duration, started_at, watch)
                self.server.requests.record(entry)

        try:
            try:
                body = read_body(self.headers, self.rfile)
            except ApiError as unreadable:
                # The rest of the body is still on the wire: answer, then close.
                self.close_connection = True
                answer: Reply | Stream | None = Reply(
                    unreadable.code, unreadable.status(), (("Connection", "close"),)
                )
            else:
                answer = self._faults(url.path + ("?" + url.query if url.query else ""))
            if answer is None:
                request = Request(
                    method=self.command,
                    path=url.path,
                    query=query,
                    accept=self.headers.get("Accept", ""),
                    content_type=self.headers.get("Content-Type", ""),
                    body=body,
                )
                answer = self.server.api.handle(request)
            if isinstance(answer, Stream):
                code = 200
                self._stream(answer, record)
            else:
                code = answer.code
                record()  # before answering, so a client that got its answer finds the request logged
                self._reply(answer)
        except (_Unanswered, OSError):  # OSError: the client went away mid-answer
            self.close_connection = True
        finally:
            record()

    def _faults(self, target: str) -> Reply | None:
        """Apply the matching faults: a Reply to answer instead of serving, None to serve."""
        faults = self.server.faults
        for fault in faults.take(self.command, target):
            if isinstance(fault.effect, Latency) and not faults.sleep(fault.effect.seconds):
                raise _Unanswered
            if isinstance(fault.effect, Hang) and not faults.hold(fault):
                raise _Unanswered
            if isinstance(fault.effect, ErrorReply):
                effect = fault.effect
                error = errors.from_code(
                    effect.code, effect.message or f"injected fault: {effect.code}", effect.retry_after_s
                )
                return Reply(error.code, error.status(), error.headers)
            if isinstance(fault.effect, Garbled):
                return Reply(200, fault.effect.body)
        return None

    def _reply(self, reply: Reply) -> None:
        if isinstance(reply.body, str):
            data, content_type = reply.body.encode(), "text/plain; charset=utf-8"
        else:
            data, content_type = json.dumps(reply.body, separators=(",", ":")).encode(), "application/json"
        self.send_response(reply.code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for name, value in reply.headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, stream: Stream, record: Callable[[], None]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.flush()
        record()
        events = stream.events
        try:
            for event in events:
                if event is None:
                    if self._client_left():
                        self.close_connection = True
                        return
                    continue
                data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
                self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))
            self.wfile.write(b"0\r\n\r\n")
        except WatchDropped:
            self.close_connection = True
            _cut(self.connection)
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()

    def _client_left(self) -> bool:
        """A watch client that went away shows as a readable socket with nothing to read."""
        poller = select.poll()
        poller.register(self.connection, select.POLLIN)
        try:
            return bool(poller.poll(0)) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True
