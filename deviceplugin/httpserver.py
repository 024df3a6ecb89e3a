"""The bounded HTTP/1.1 server under the daemon's `/metrics` and the extender.

`http.server`, which both used before, says of itself that it is not for production, and it was
not: one thread per connection without a cap (1,000 half-open connections made 1,013 threads), no
time limit on the daemon's listener, and a body read whole up to what Content-Length claimed.
`bench/http_servers.py` measures it against `http.server`, waitress and uvicorn.

One asyncio event-loop thread holds every connection, so an idle, slow or half-open connection
costs a socket and a few KiB, never a thread. Each complete request goes to a fixed pool of worker
threads that run the handler (a plain function, `Request` in, `Response` out). The `Limits`:

- head (request line and headers) up to `max_header_bytes`, else 431;
- body up to `max_body_bytes`, judged on Content-Length before one byte of it is read: 413 and
  the connection closed; bodies held at once (being read, waiting or being handled) up to
  `body_budget_bytes` in all, counted as their bytes arrive: a request whose next bytes do not
  fit waits for room;
- `max_connections` open: a new connection closes the one idle longest (never one being
  answered), so idle or half-open connections cannot lock a client out;
- a request must arrive whole within `request_timeout_s` of its first byte, and a new connection
  must start one within that time: else 408 and the connection closed. A keep-alive connection
  idle `idle_timeout_s` between requests is closed; a reply the client does not take within
  `request_timeout_s` is dropped;
- up to `workers + max_pending` requests handled or waiting for a worker; beyond, 503.

Every refusal is counted in `HttpStats` (exported by `HttpCollector`).

A reply goes out in one write, head and body together, on a socket with TCP_NODELAY (asyncio sets
it on every TCP connection it makes or accepts): with the head and body in two writes and Nagle
on, each reply waited ~40 ms for the client's delayed ACK (issue 15), far longer than the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from deviceplugin.logs import get_log

log = get_log(__name__)

KiB = 1024
MiB = 1024 * KiB
BODY_CHUNK = 64 * KiB  # a body is read, and its room taken, this much at a time
LINGER_S = 2.0  # after a refusal, how long unread request bytes are taken and dropped (see _close)
# Why connections were refused or closed early; every key exists from the start, so a scrape
# from another thread never iterates a dict that is growing.
REASONS = ("bad_request", "head_too_large", "body_too_large", "timeout", "busy", "evicted", "refused")


@dataclass(frozen=True, slots=True)
class Limits:
    """What one server holds at most; `body_budget_bytes` None means twice `max_body_bytes`."""

    max_body_bytes: int = 1 * MiB
    body_budget_bytes: int | None = None
    max_header_bytes: int = 64 * KiB
    max_connections: int = 256
    workers: int = 4
    max_pending: int = 32
    request_timeout_s: float = 10.0
    idle_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_header_bytes", "max_connections", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.max_pending < 0:
            raise ValueError(f"max_pending must not be negative, not {self.max_pending}")
        if self.budget < self.max_body_bytes:
            raise ValueError(f"body_budget_bytes {self.budget} is below max_body_bytes {self.max_body_bytes}")
        for name in ("request_timeout_s", "idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be above 0, not {getattr(self, name)}")

    @property
    def budget(self) -> int:
        return 2 * self.max_body_bytes if self.body_budget_bytes is None else self.body_budget_bytes


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    target: str
    version: str  # HTTP/1.1 or HTTP/1.0
    headers: dict[str, str]  # names in lower case
    body: bytes

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False


Handler = Callable[[Request], Response]
ErrorBody = Callable[[int, str], Response]  # (status, message) -> the reply the server sends


def text_error(status: int, message: str) -> Response:
    return Response(status, f"{message}\n".encode())


class HttpStats:
    """Refusals by reason (`REASONS`) and open connections; kept across servers that replace one
    another (the daemon's listener moves on a reload)."""

    def __init__(self) -> None:
        self.refusals = dict.fromkeys(REASONS, 0)
        self.open = 0


class HttpCollector(Collector):
    """`{prefix}_http_connections` (open now) and `{prefix}_http_refusals_total{reason}`."""

    def __init__(self, prefix: str, stats: HttpStats) -> None:
        self.prefix = prefix
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            f"{self.prefix}_http_connections", "Open HTTP connections", value=self.stats.open
        )
        refusals = CounterMetricFamily(
            f"{self.prefix}_http_refusals",
            "HTTP requests refused or connections closed early by the server's limits, by reason "
            "(evicted: idle longest when the connection cap was reached)",
            labels=["reason"],
        )
        for reason, count in self.stats.refusals.items():
            refusals.add_metric([reason], count)
        yield refusals


class _Refused(Exception):
    """The request is answered with `status` and the connection closed."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


class _Budget:
    """Bytes of request bodies in memory, across connections (used on the loop thread only)."""

    def __init__(self, total: int) -> None:
        self.free = total
        self._changed = asyncio.Condition()

    async def take(self, size: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.free >= size)
            self.free -= size

    async def give(self, size: int) -> None:
        async with self._changed:
            self.free += size
            self._changed.notify_all()


@dataclass(eq=False, slots=True)
class _Connection:
    writer: asyncio.StreamWriter
    last_active: float
    busy: bool = False  # a request of it is being handled or answered: never evicted then


class HttpServer:
    """Serves `handler` on `address` (host, port; port 0 picks a free one). The socket is bound
    here, so a bad address fails at construction (OSError); `start()` begins serving."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: Handler,
        limits: Limits | None = None,
        *,
        name: str = "http",
        errors: ErrorBody = text_error,
        stats: HttpStats | None = None,
    ) -> None:
        host, port = address
        self.family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, port), family=self.family, backlog=1024)
        self.handler = handler
        self.limits = limits or Limits()
        self.name = name
        self.errors = errors
        self.stats = stats or HttpStats()
        self._connections: dict[_Connection, None] = {}  # in arrival order
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending = 0
        self._pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix=f"{name}-worker")
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None

    @property
    def server_address(self) -> tuple[str, int]:
        host, port = self._socket.getsockname()[:2]
        return str(host), int(port)

    def start(self) -> None:
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name=self.name, daemon=True)
        self._thread.start()
        started.wait()

    def stop(self) -> None:
        """Close the listener and every connection; handlers still running finish on their own."""
        if self._thread is None:
            self._socket.close()
        else:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._thread = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ the loop thread

    def _run(self, started: threading.Event) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        self._budget = _Budget(self.limits.budget)
        server = loop.run_until_complete(
            asyncio.start_server(self._serve, sock=self._socket, limit=self.limits.max_header_bytes)
        )
        started.set()
        loop.run_forever()
        server.close()
        for connection in self._connections:
            connection.writer.transport.abort()
        for task in self._tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
        loop.run_until_complete(server.wait_closed())
        loop.close()

    def _admit(self, connection: _Connection) -> bool:
        """Make room for a new connection: close the one idle longest when at the cap."""
        if len(self._connections) >= self.limits.max_connections:
            idle = [c for c in self._connections if not c.busy]
            if not idle:  # every connection is being answered: this one waits for nothing
                self.stats.refusals["refused"] += 1
                return False
            victim = min(idle, key=lambda c: c.last_active)
            victim.writer.transport.abort()
            del self._connections[victim]
            self.stats.refusals["evicted"] += 1
        self._connections[connection] = None
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        connection = _Connection(writer, self._loop.time())
        # drain() then waits until the kernel has every byte, so closing never cuts a reply short
        writer.transport.set_write_buffer_limits(high=0)
        self.stats.open += 1
        try:
            if self._admit(connection):
                await self._requests(connection, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away, or the connection was evicted
        except asyncio.CancelledError:
            pass  # stop(): ends as any closed connection does (asyncio reports a cancelled one)
        finally:
            self._connections.pop(connection, None)
            self.stats.open -= 1
            self._tasks.discard(task)
            writer.transport.abort()

    async def _requests(
        self, connection: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        limits = self.limits
        wait = limits.request_timeout_s  # a new connection must start its request in that time
        while True:
            connection.busy = False
            try:
                async with asyncio.timeout(wait):
                    first = await reader.read(1)
            except TimeoutError:
                return  # idle: closed without a reply (a 408 here would race the client's next request)
            if not first:
                return
            connection.last_active = self._loop.time()
            try:
                request, held = await self._read(first, reader, writer)
            except _Refused as refused:
                self.stats.refusals[refused.reason] += 1
                await self._write(writer, self._error(refused.status, str(refused)), keep=False)
                await self._linger(reader, writer)
                return
            connection.busy = True
            try:
                response = await self._dispatch(request)
            finally:
                await self._budget.give(held)
            keep = _keep_alive(request) and not response.close
            await self._write(writer, response, keep)
            if not keep:
                return
            connection.last_active = self._loop.time()
            wait = limits.idle_timeout_s

    async def _read(
        self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[Request, int]:
        """The whole request within the request time limit, and the body bytes it holds."""
        limits = self.limits
        held = 0
        waiting_for_room = False
        try:
            async with asyncio.timeout(limits.request_timeout_s):
                try:
                    head = first + await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    raise _Refused(
                        HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                        "head_too_large",
                        f"request line and headers over {limits.max_header_bytes} bytes",
                    ) from None
                method, target, version, headers = _parse_head(head)
                length = _content_length(headers, limits.max_body_bytes)
                if headers.get("expect", "").lower() == "100-continue" and length:
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                # Room is taken as the bytes arrive, not as Content-Length announces them: two
                # connections announcing the largest body and sending none held it all before.
                chunks: list[bytes] = []
                while held < length:
                    chunk = await reader.read(min(length - held, BODY_CHUNK))
                    if not chunk:
                        raise asyncio.IncompleteReadError(b"".join(chunks), length)
                    waiting_for_room = True
                    await self._budget.take(len(chunk))
                    waiting_for_room = False
                    held += len(chunk)
                    chunks.append(chunk)
                body = b"".join(chunks)
        except TimeoutError:
            await self._budget.give(held)
            if waiting_for_room:
                raise _Refused(
                    HTTPStatus.SERVICE_UNAVAILABLE, "busy", "too many request bodies in memory; retry"
                ) from None
            raise _Refused(
                HTTPStatus.REQUEST_TIMEOUT,
                "timeout",
                f"the request did not arrive whole within {limits.request_timeout_s:g} s",
            ) from None
        except BaseException:
            await self._budget.give(held)
            raise
        return Request(method, target, version, headers, body), held

    async def _dispatch(self, request: Request) -> Response:
        if self._pending >= self.limits.workers + self.limits.max_pending:
            self.stats.refusals["busy"] += 1
            return self._error(HTTPStatus.SERVICE_UNAVAILABLE, "too many requests waiting; retry")
        self._pending += 1
        try:
            return await self._loop.run_in_executor(self._pool, self._handle, request)
        finally:
            self._pending -= 1

    def _handle(self, request: Request) -> Response:  # on a worker thread
        try:
            return self.handler(request)
        except Exception as err:  # a bug must answer, not drop the connection
            log.error("request failed", server=self.name, path=request.path, error=repr(err))
            return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {err!r}")

    def _error(self, status: int, message: str) -> Response:
        return self.errors(status, message)

    async def _write(self, writer: asyncio.StreamWriter, response: Response, keep: bool) -> None:
        status = HTTPStatus(response.status)
        lines = [
            f"HTTP/1.1 {status.value} {status.phrase}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            *(f"{name}: {value}" for name, value in response.headers),
        ]
        if not keep:
            lines.append("Connection: close")
        # One write: a head sent apart from its body would wait on the client's delayed ACK.
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body)
        try:
            async with asyncio.timeout(self.limits.request_timeout_s):
                await writer.drain()
        except TimeoutError:
            self.stats.refusals["timeout"] += 1
            raise ConnectionAbortedError("the client did not take its reply") from None

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """After a refusal, send FIN and drop what the client still sends for a moment: closing
        with unread bytes would reset the connection, and the client could lose the reply."""
        if writer.can_write_eof():
            writer.write_eof()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(LINGER_S, self.limits.request_timeout_s)):
                while await reader.read(64 * KiB):
                    pass


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    """Method, target, version and headers (lower-case names; repeated ones joined with commas)."""
    request_line, *lines = head.decode("latin-1").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1]:
        raise _Refused(HTTPStatus.BAD_REQUEST, "bad_request", f"malformed request line {request_line[:80]!r}")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _Refused(
            HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "bad_request", f"{version[:20]!r}: HTTP/1.x only"
        )
    headers: dict[str, str] = {}
    for line in lines:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _Refused(HTTPStatus.BAD_REQUEST, "bad_request", f"malformed header line {line[:80]!r}")
        key, value = name.lower(), value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return method, target, version, headers


def _content_length(headers: dict[str, str], limit: int) -> int:
    if "transfer-encoding" in headers:
        raise _Refused(HTTPStatus.LENGTH_REQUIRED, "bad_request", "send the body with a Content-Length")
    raw = headers.get("content-length", "0")
    if not (raw.isascii() and raw.isdigit()):
        raise _Refused(HTTPStatus.BAD_REQUEST, "bad_request", f"bad Content-Length {raw[:40]!r}")
    digits = raw.lstrip("0") or "0"
    if len(digits) > len(str(limit)) or int(digits) > limit:  # never int() of a huge number
        shown = digits if len(digits) <= 20 else f"a {len(digits)}-digit number of"
        message = f"body of {shown} bytes; the limit is {limit}"
        raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body_too_large", message)
    return int(digits)


def _keep_alive(request: Request) -> bool:
    connection = request.headers.get("connection", "").lower()
    if request.version == "HTTP/1.0":
        return "keep-alive" in connection
    return "close" not in connection
