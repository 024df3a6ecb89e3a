"""The extender's HTTP server: POST /filter, /prioritize, /bind (JSON); GET /healthz (alive: the
server answers), /readyz (503 with the reasons until the node and pod caches have synced, and
while either is down or its worker is restarting in a loop) and /metrics (Prometheus text).

HTTP/1.1 with keep-alive (kube-scheduler reuses its connections), one thread per connection.
The verb is the last path segment, so a `urlPrefix` with a path (`http://host:8888/gpu`) works.
A body that is not JSON or not the verb's shape is a 400 whose JSON body has an `Error`.
"""

from __future__ import annotations

import json
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from deviceplugin.extender.config import split_address
from deviceplugin.extender.protocol import BadRequest, parse_binding_args, parse_extender_args
from deviceplugin.extender.service import ExtenderService
from deviceplugin.logs import get_log

log = get_log(__name__)

MAX_BODY_BYTES = 256 * 1024 * 1024  # full NodeLists of thousands of nodes are large
IDLE_TIMEOUT_S = 120.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the default 5 resets bursts of connections

    def __init__(
        self,
        address: tuple[str, int],
        service: ExtenderService,
        family: socket.AddressFamily,
        registry: CollectorRegistry,
    ) -> None:
        self.address_family = family
        self.service = service
        self.registry = registry
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_S
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http", request=format % args)

    def _reply(self, status: int, body: object) -> None:
        self._send(status, json.dumps(body, separators=(",", ":")).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _verb(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]

    def do_GET(self) -> None:
        verb = self._verb()
        if verb in ("healthz", "livez"):
            self._reply(HTTPStatus.OK, "ok")
            return
        if verb == "readyz":
            problems = self.server.service.readiness()
            status = HTTPStatus.SERVICE_UNAVAILABLE if problems else HTTPStatus.OK
            self._reply(status, "; ".join(problems) or "ok")
            return
        if verb == "metrics":
            self._send(HTTPStatus.OK, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
            return
        if verb in ("filter", "prioritize", "bind"):
            self._reply(HTTPStatus.METHOD_NOT_ALLOWED, {"Error": f"{verb} takes POST"})
            return
        self._reply(HTTPStatus.NOT_FOUND, {"Error": f"no such endpoint {self.path}"})

    def do_POST(self) -> None:
        verb = self._verb()
        if verb not in ("filter", "prioritize", "bind"):
            self._drain()
            self._reply(
                HTTPStatus.NOT_FOUND,
                {"Error": f"no such endpoint {self.path}; try /filter, /prioritize, /bind"},
            )
            return
        try:
            body = self._body()
            service = self.server.service
            if verb == "filter":
                reply: object = service.filter(parse_extender_args(body))
            elif verb == "prioritize":
                reply = service.prioritize(parse_extender_args(body))
            else:
                reply = service.bind(parse_binding_args(body))
        except BadRequest as err:
            self._reply(HTTPStatus.BAD_REQUEST, {"Error": f"{verb}: {err}"})
            return
        except Exception as err:  # a bug must answer, not hang the scheduler
            log.error("request failed", verb=verb, error=repr(err))
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"Error": f"{verb}: internal error: {err!r}"})
            return
        self._reply(HTTPStatus.OK, reply)

    def _length(self) -> int:
        raw = self.headers.get("Content-Length")
        if raw is None:
            raise BadRequest("the request needs a Content-Length header and a JSON body")
        try:
            length = int(raw)
        except ValueError:
            raise BadRequest(f"bad Content-Length {raw!r}") from None
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            raise BadRequest(f"body of {length} bytes; the limit is {MAX_BODY_BYTES}")
        return length

    def _drain(self) -> None:
        try:
            length = self._length()
        except BadRequest:
            self.close_connection = True
            return
        self.rfile.read(length)

    def _body(self) -> object:
        data = self.rfile.read(self._length())
        if not data.strip():
            raise BadRequest("the request body is empty; it must be a JSON object")
        try:
            return json.loads(data)
        except ValueError as err:
            raise BadRequest(f"the request body is not valid JSON: {err}") from None


class ExtenderHttpServer:
    """Serves an `ExtenderService` on `address` (`HOST:PORT`, `:PORT`; port 0 picks a free one),
    and `registry` on /metrics."""

    def __init__(
        self, service: ExtenderService, address: str, registry: CollectorRegistry | None = None
    ) -> None:
        host, port = split_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._server = _Server(
            (host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port),
            service,
            family,
            registry or CollectorRegistry(auto_describe=False),
        )
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = str(self._server.server_address[0])
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1" if self._server.address_family == socket.AF_INET else "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="extender-http",
            daemon=True,
        )
        self._thread.start()
        log.info("extender listening", url=self.url)

    def stop(self) -> None:
        if self._thread is None:
            self._server.server_close()
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._thread = None
