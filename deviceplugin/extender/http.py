"""The extender's HTTP surface: POST /filter, /prioritize, /bind (JSON); GET /healthz (alive: the
server answers), /readyz (503 with the reasons until the node and pod caches have synced, and
while either is down or its worker is restarting in a loop) and /metrics (Prometheus text).

Served by `deviceplugin.httpserver` (HTTP/1.1 keep-alive, which kube-scheduler uses; a fixed pool
of worker threads; bounded body size, connections and request time: `limits_for`). The verb is
the last path segment, so a `urlPrefix` with a path (`http://host:8888/gpu`) works. A body that is
not JSON or not the verb's shape is a 400, and a request the server's limits refuse gets the
status they give (413, 408, 503...): either way a JSON body with an `Error`.
"""

from __future__ import annotations

import json
from http import HTTPStatus

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from deviceplugin.extender.config import ExtenderConfig
from deviceplugin.extender.protocol import BadRequest, parse_binding_args, parse_extender_args
from deviceplugin.extender.service import ExtenderService
from deviceplugin.fit import jsontext
from deviceplugin.httpserver import HttpServer, HttpStats, Limits, Request, Response
from deviceplugin.logs import get_log
from deviceplugin.options import split_address

log = get_log(__name__)

VERBS = ("filter", "prioritize", "bind")
# kube-scheduler's parallel binds wait on the API server in the workers; filter and prioritize
# come one at a time (one scheduling cycle after another).
WORKERS = 8


def limits_for(config: ExtenderConfig) -> Limits:
    """Two bodies of the largest size in memory at once: a filter and its prioritize, or a
    request and a retry; more wait (docs/extender.md, "Limits")."""
    return Limits(
        max_body_bytes=config.max_body_bytes,
        body_budget_bytes=2 * config.max_body_bytes,
        max_connections=config.max_connections,
        workers=WORKERS,
        max_pending=64,
        request_timeout_s=config.request_timeout,
    )


def json_response(status: int, body: object) -> Response:
    return Response(status, json.dumps(body, separators=(",", ":")).encode(), "application/json")


def error_response(status: int, message: str) -> Response:
    return json_response(status, {"Error": message})


class ExtenderHandler:
    """One request in, one reply out (run on the server's worker threads)."""

    def __init__(self, service: ExtenderService, registry: CollectorRegistry) -> None:
        self.service = service
        self.registry = registry

    def __call__(self, request: Request) -> Response:
        verb = request.path.rstrip("/").rsplit("/", 1)[-1]
        if request.method == "GET":
            return self._get(verb, request.target)
        if request.method != "POST":
            return error_response(
                HTTPStatus.METHOD_NOT_ALLOWED, f"{request.method} is not served; GET or POST"
            )
        if verb not in VERBS:
            return error_response(
                HTTPStatus.NOT_FOUND, f"no such endpoint {request.target}; try /filter, /prioritize, /bind"
            )
        try:
            body = request_body(request.body)
            if verb == "filter":
                reply: object = self.service.filter(parse_extender_args(body))
            elif verb == "prioritize":
                reply = self.service.prioritize(parse_extender_args(body))
            else:
                reply = self.service.bind(parse_binding_args(body))
        except BadRequest as err:
            return error_response(HTTPStatus.BAD_REQUEST, f"{verb}: {err}")
        except Exception as err:  # a bug must answer, not hang the scheduler
            log.error("request failed", verb=verb, error=repr(err))
            return error_response(HTTPStatus.INTERNAL_SERVER_ERROR, f"{verb}: internal error: {err!r}")
        return json_response(HTTPStatus.OK, reply)

    def _get(self, verb: str, target: str) -> Response:
        if verb in ("healthz", "livez"):
            return json_response(HTTPStatus.OK, "ok")
        if verb == "readyz":
            problems = self.service.readiness()
            status = HTTPStatus.SERVICE_UNAVAILABLE if problems else HTTPStatus.OK
            return json_response(status, "; ".join(problems) or "ok")
        if verb == "metrics":
            return Response(HTTPStatus.OK, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        if verb in VERBS:
            return error_response(HTTPStatus.METHOD_NOT_ALLOWED, f"{verb} takes POST")
        return error_response(HTTPStatus.NOT_FOUND, f"no such endpoint {target}")


def request_body(data: bytes) -> object:
    if not data.strip():
        raise BadRequest("the request body is empty; it must be a JSON object")
    try:
        return jsontext.loads(data)
    except ValueError as err:
        raise BadRequest(f"the request body is not valid JSON: {err}") from None


class ExtenderHttpServer:
    """Serves an `ExtenderService` on `address` (`HOST:PORT`, `:PORT` for every interface; port 0
    picks a free one), and `registry` on /metrics; `stats` counts what the limits refused."""

    def __init__(
        self,
        service: ExtenderService,
        address: str,
        registry: CollectorRegistry | None = None,
        *,
        limits: Limits | None = None,
        stats: HttpStats | None = None,
    ) -> None:
        host, port = split_address(address)
        handler = ExtenderHandler(service, registry or CollectorRegistry(auto_describe=False))
        self._server = HttpServer(
            (host or "0.0.0.0", port),
            handler,
            limits or limits_for(service.config),
            name="extender-http",
            errors=error_response,
            stats=stats,
        )

    @property
    def stats(self) -> HttpStats:
        return self._server.stats

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        self._server.start()
        log.info("extender listening", url=self.url)

    def stop(self) -> None:
        self._server.stop()
