"""A small typed facade over the core/v1 API, speaking JSON dicts.

Requests go out as the official client's generated CoreV1Api would send them (its headers and
refreshed token, the same paths and query strings), on the connections of the client's urllib3
pool (TLS as the client configured it). `wire` writes a request and reads its answer on one of
them, at a third of the CPU of urllib3's own request path; watches, and every request through a
proxy, go through urllib3. CoreV1Api itself is never built: importing it and its validated
methods costs a second of start-up (bench/startup.py), and its per-call argument validation and
serialisation cost a fifth of an outbox PATCH's CPU (bench/outbox.py --profile). Callers get
objects as the API serves them (camelCase JSON, what `deviceplugin.fit` reads); PATCHes return
nothing: no caller reads the object the server answers with, and parsing it (a node's JSON runs to
tens of KB) would be CPU for nothing. Errors surface as `ApiError` with a classification the retry
logic uses. The API calls this project makes are all here, which keeps the RBAC rules checkable.

urllib3 (and `wire`, which works on its connections) is imported where a request is made, never
with this module: the node daemon builds its `Kube` unconnected and registers with kubelet before
it loads the client (bench/startup.py), and the client imports urllib3 anyway; once it is loaded,
those imports are a lookup.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import kubernetes
    import urllib3

from deviceplugin.backoff import Backoff, Retries
from deviceplugin.logs import get_log

log = get_log(__name__)

Obj = dict[str, Any]
T = TypeVar("T")

CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 10.0
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
ABSENT = frozenset({422})  # a JSON patch removing a path that is not there
JSON = "application/json"
PODS = "/api/v1/pods"
NODES = "/api/v1/nodes"
# Between tries of one call (`retry`): a struggling API server is not hit with a tight loop, and
# the caller, waiting on the result, is not kept long past the server's return.
API_CALL_RETRY = Backoff(start_s=0.1, max_s=5.0)


class ApiError(Exception):
    """A failed API call. `status` is the HTTP status, 0 when no answer came (connection, timeout)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status or 'no answer'} {reason}: {message}" if reason else message)
        self.status = status
        self.reason = reason

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def transient(self) -> bool:
        """Worth retrying as is: the server or the network failed, not the request."""
        return self.status == 0 or self.status in TRANSIENT_STATUS

    @property
    def expired(self) -> bool:
        return self.status == 410


class ConfigError(Exception):
    """No usable Kubernetes client configuration."""


def _from_answer(status: int, reason: str, body: str) -> ApiError:
    """An error answer: the reason and message of its Status body, else the HTTP reason and body."""
    message = body
    try:
        answer = json.loads(body)
        reason, message = answer.get("reason") or reason, answer.get("message") or message
    except (ValueError, AttributeError):
        pass
    return ApiError(status, reason, message)


def _from_exception(err: Exception) -> ApiError:
    """A request that got no answer (connection, TLS, timeout)."""
    return ApiError(0, type(err).__name__, str(err))


def _unanswered(err: Exception) -> bool:
    """Whether `err` is how a request fails that got no answer: urllib3's errors and the socket's."""
    import urllib3  # noqa: PLC0415  # see the module's docstring

    return isinstance(err, urllib3.exceptions.HTTPError | OSError)


# The client's kubeconfig loader indexes whatever the YAML holds: a file of another shape (a list, a
# string, `clusters: 5`) fails inside it with these rather than with its ConfigException.
_MALFORMED = (TypeError, AttributeError, KeyError, IndexError)


def _malformed(err: Exception) -> str:
    """One line saying what is wrong with a kubeconfig of another shape."""
    return (
        "not a kubeconfig (expected a YAML mapping with lists of clusters, contexts and users): "
        f"{type(err).__name__}: {err}"
    )


def load_client(kubeconfig: Path | None) -> kubernetes.client.ApiClient:
    """From a kubeconfig file, else the pod's service account (in-cluster)."""
    # Imported here, not with this module: the package costs a quarter of a second to import, and
    # the node daemon registers with kubelet before it loads its client (bench/startup.py); yaml
    # likewise, for the kubeconfig loader's errors.
    import kubernetes  # noqa: PLC0415
    import yaml  # noqa: PLC0415

    client: kubernetes.client.ApiClient
    try:
        if kubeconfig is not None:
            client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        else:
            configuration = kubernetes.client.Configuration()
            kubernetes.config.load_incluster_config(client_configuration=configuration)
            client = kubernetes.client.ApiClient(configuration)
    except (kubernetes.config.ConfigException, OSError, ValueError) as err:
        raise ConfigError(f"cannot use the {_source(kubeconfig)}: {err}") from None
    except yaml.YAMLError as err:
        invalid = " ".join(str(err).split())
        raise ConfigError(f"cannot use the {_source(kubeconfig)}: not valid YAML: {invalid}") from None
    except _MALFORMED as err:
        raise ConfigError(f"cannot use the {_source(kubeconfig)}: {_malformed(err)}") from None
    # Our own retry loops decide when to try again; urllib3's would stretch every outage.
    client.configuration.retries = False
    client.rest_client = kubernetes.client.rest.RESTClientObject(client.configuration)
    return client


def _source(kubeconfig: Path | None) -> str:
    return f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster service account"


class Kube:
    """The API calls the daemon makes, as JSON in and out. Made without a client (None), it is
    not connected: every call fails as unanswered (transient) until `client` is set."""

    def __init__(self, client: kubernetes.client.ApiClient | None) -> None:
        self.client = client
        self.errors: Counter[tuple[str, int]] = Counter()  # failed calls by (call, HTTP status or 0)
        self._route: _Route | None = None  # where `client`'s requests go

    @cached_property
    def timeout(self) -> urllib3.Timeout:
        """Connect and read timeouts of every request but a watch (settable)."""
        import urllib3  # noqa: PLC0415  # see the module's docstring

        return urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S)

    def _connected(self, call: str) -> kubernetes.client.ApiClient:
        if self.client is None:
            raise self._counted(call, ApiError(0, "NotConnected", "no API client loaded yet"))
        return self.client

    def _headers(
        self, client: kubernetes.client.ApiClient, method: str, path: str, body: Any, content_type: str
    ) -> dict[str, str]:
        """The headers CoreV1Api would send: the client's, its cookie and its (refreshed) token."""
        headers = {**client.default_headers, "Accept": JSON}
        if body is not None:
            headers["Content-Type"] = content_type
        if client.cookie:
            headers["Cookie"] = client.cookie
        client.update_params_for_auth(headers, None, ["BearerToken"], path, method, body)
        return headers

    def _route_of(self, client: kubernetes.client.ApiClient) -> _Route:
        route = self._route
        if route is None or route.client is not client:
            route = self._route = _Route(client)
        return route

    def _send(
        self,
        call: str,
        method: str,
        path: str,
        query: Sequence[tuple[str, str | None]] = (),
        body: Any = None,
        *,
        content_type: str = JSON,
        expected: frozenset[int] = frozenset(),
    ) -> tuple[int, bytes]:
        """`method` on `path` (under the API root) with the `query` parameters that are not None,
        as CoreV1Api's `call` would send it, less its per-call validation; the answer's status and
        body. An answer whose status is one of `expected` (an outcome the caller takes, not a
        failure) is returned as any success is; any other failure raises `ApiError`, counted in
        `errors` as `call`."""
        client = self._connected(call)
        headers = self._headers(client, method, path, body, content_type)
        route = self._route_of(client)
        target = route.prefix + path + _query_string(query)
        payload = None if body is None else json.dumps(body).encode()
        try:
            if route.pool is None:
                response = client.rest_client.pool_manager.request(
                    method, route.origin + target, body=payload, headers=headers, timeout=self.timeout
                )
                status, reason, data = response.status, response.reason or "", response.data
            else:
                from deviceplugin.kube import wire  # noqa: PLC0415  # see the module's docstring

                request = route.request(method, target, headers, payload)
                status, reason, data = wire.exchange(route.pool, method, request, self.timeout)
        except Exception as err:
            if not _unanswered(err):
                raise
            raise self._counted(call, _from_exception(err)) from None
        if not 200 <= status <= 299 and status not in expected:
            answer = data.decode("utf-8", "replace")
            raise self._counted(call, _from_answer(status, reason, answer))
        return status, data

    def _stream(
        self, call: str, path: str, query: Sequence[tuple[str, str | None]], timeout: urllib3.Timeout
    ) -> urllib3.BaseHTTPResponse:
        """A GET whose answer is read as it comes (a watch), through urllib3's response."""
        client = self._connected(call)
        headers = self._headers(client, "GET", path, None, JSON)
        route = self._route_of(client)
        try:
            response = client.rest_client.pool_manager.request(
                "GET",
                route.origin + route.prefix + path + _query_string(query),
                headers=headers,
                timeout=timeout,
                preload_content=False,
            )
            if not 200 <= response.status <= 299:
                answer = response.data.decode("utf-8", "replace")
                raise self._counted(call, _from_answer(response.status, response.reason or "", answer))
        except Exception as err:
            if not _unanswered(err):
                raise
            raise self._counted(call, _from_exception(err)) from None
        return response

    def _json(
        self, call: str, path: str, query: Sequence[tuple[str, str | None]] = (), body: Any = None
    ) -> Obj:
        """The JSON answer to a GET of `path`, or to a POST of `body` there."""
        method = "GET" if body is None else "POST"
        result: Obj = json.loads(self._send(call, method, path, query, body)[1])
        return result

    def _counted(self, call: str, error: ApiError) -> ApiError:
        self.errors[(call, error.status)] += 1
        return error

    def _patch(
        self, call: str, path: str, body: Any, content_type: str, expected: frozenset[int] = frozenset()
    ) -> int:
        """The answer's status: a success's, or one of `expected`."""
        return self._send(call, "PATCH", path, body=body, content_type=content_type, expected=expected)[0]

    def list_pods(self, field_selector: str) -> tuple[list[Obj], str]:
        """Pods matching the selector, and the list's resourceVersion to watch from."""
        listed = self._json("list_pod_for_all_namespaces", PODS, [("fieldSelector", field_selector or None)])
        return list(listed.get("items") or []), str(listed.get("metadata", {}).get("resourceVersion", ""))

    def watch_pods(self, field_selector: str, resource_version: str, timeout_s: int) -> WatchStream:
        """A watch from `resource_version` (bookmarks on); the server ends it after `timeout_s`."""
        return self._watch("watch_pods", PODS, field_selector, resource_version, timeout_s)

    def list_nodes_versioned(self, field_selector: str = "") -> tuple[list[Obj], str]:
        """Nodes matching the selector, and the list's resourceVersion to watch from."""
        listed = self._json("list_node", NODES, [("fieldSelector", field_selector or None)])
        return list(listed.get("items") or []), str(listed.get("metadata", {}).get("resourceVersion", ""))

    def watch_nodes(self, field_selector: str, resource_version: str, timeout_s: int) -> WatchStream:
        """A watch of nodes from `resource_version`, like `watch_pods`."""
        return self._watch("watch_nodes", NODES, field_selector, resource_version, timeout_s)

    def bind_pod(
        self, namespace: str, name: str, node: str, annotations: Mapping[str, str], uid: str = ""
    ) -> Obj:
        """Create the pod's Binding (`pods/binding`): the node and `annotations` land on the pod in one
        write. With `uid` the bind only applies to that incarnation of the pod."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": dict(annotations)}
        if uid:
            metadata["uid"] = uid
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        return self._json("create_namespaced_pod_binding", _pod_path(namespace, name) + "/binding", body=body)

    def _watch(
        self, call: str, path: str, field_selector: str, resource_version: str, timeout_s: int
    ) -> WatchStream:
        """A watch; `call` names it in the API error counts (`watch_pods`, `watch_nodes`)."""
        import urllib3  # noqa: PLC0415  # see the module's docstring

        query = [
            ("allowWatchBookmarks", "true"),
            ("fieldSelector", field_selector or None),  # "" would send an empty fieldSelector=
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_s)),
            ("watch", "true"),
        ]
        timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=timeout_s + READ_TIMEOUT_S)
        return WatchStream(self._stream(call, path, query, timeout))

    def get_node(self, name: str) -> Obj:
        return self._json("read_node", _node_path(name))

    def list_nodes(self) -> list[Obj]:
        """Every node (read-only; `deviceplugin inspect`)."""
        return list(self._json("list_node", NODES).get("items") or [])

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        self._patch("patch_node", _node_path(name), dict(patch), MERGE_PATCH)

    def remove_node_annotation(self, name: str, key: str) -> bool:
        """Remove one annotation; False when it was already absent. A JSON patch, so an absent key
        costs no write: the server refuses it with 422 and writes nothing, the outcome wanted, so
        that answer is not an error (nor counted as one)."""
        pointer = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
        removal = [{"op": "remove", "path": pointer}]
        return self._patch("patch_node", _node_path(name), removal, JSON_PATCH, ABSENT) not in ABSENT

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> None:
        self._patch("patch_node_status", _node_path(name) + "/status", dict(patch), MERGE_PATCH)

    def get_pod(self, namespace: str, name: str) -> Obj:
        return self._json("read_namespaced_pod", _pod_path(namespace, name))

    def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> None:
        """Merge `annotations` into the pod (None removes a key). With `resource_version` the write
        only lands on that version of the pod (409 otherwise): for writes whose order matters."""
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        self._patch("patch_namespaced_pod", _pod_path(namespace, name), {"metadata": metadata}, MERGE_PATCH)

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> Obj:
        return self._json(
            "create_namespaced_event", f"/api/v1/namespaces/{_quoted(namespace)}/events", body=dict(event)
        )


class _Route:
    """Where a client's requests go: its API root, and the connection pool that `wire` sends on
    (None through a proxy, where urllib3 sends every request itself)."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        import urllib3  # noqa: PLC0415  # see the module's docstring

        self.client = client
        url = urllib.parse.urlsplit(client.configuration.host)
        self.origin = f"{url.scheme}://{url.netloc}"
        self.prefix = url.path  # a root below the host's, as in https://proxy/k8s/clusters/c-1
        manager = client.rest_client.pool_manager
        proxied = isinstance(manager, urllib3.ProxyManager)
        self.pool: urllib3.HTTPConnectionPool | None = (
            None if proxied else manager.connection_from_url(self.origin)
        )
        self._host = f"Host: {url.netloc.rpartition('@')[2]}\r\n"

    def request(self, method: str, target: str, headers: Mapping[str, str], body: bytes | None) -> bytes:
        """The request's bytes, as http.client would write them."""
        lines = [f"{method} {target} HTTP/1.1\r\n", self._host]
        for name, value in headers.items():
            if "\n" in value or "\r" in value:
                raise ValueError(f"invalid value for the {name} header")  # as http.client refuses one
            lines.append(f"{name}: {value}\r\n")
        if body is not None:
            lines.append(f"Content-Length: {len(body)}\r\n")
        lines.append("\r\n")
        head = "".join(lines).encode("latin-1")
        return head if body is None else head + body


def _query_string(query: Sequence[tuple[str, str | None]]) -> str:
    pairs = [f"{name}={urllib.parse.quote(value)}" for name, value in query if value is not None]
    return "?" + "&".join(pairs) if pairs else ""


# What quote() leaves as it is: every object name (DNS labels and subdomains) is made of these.
_UNQUOTED = re.compile(r"[A-Za-z0-9_.~-]*")


def _quoted(segment: str) -> str:
    """A name as one path segment (as the client quotes path parameters)."""
    return segment if _UNQUOTED.fullmatch(segment) else urllib.parse.quote(segment, safe="")


def _node_path(name: str) -> str:
    return f"{NODES}/{_quoted(name)}"


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{_quoted(namespace)}/pods/{_quoted(name)}"


class WatchStream:
    """Watch events (`{"type", "object"}` dicts) from an open response. `close()` may be called
    from another thread to end a blocked read at once: the iteration then just ends."""

    def __init__(self, response: Any) -> None:
        self._response = response
        self._closed = False

    def __iter__(self) -> Iterator[Obj]:
        buffer = b""
        try:
            for chunk in self._response.stream(64 * 1024, decode_content=False):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        except Exception as err:
            if self._closed:
                # close() tore the response down under this read. What the half-read response
                # raises then depends on where the read was (a reset socket, or the file object
                # http.client drops mid-chunk: AttributeError); either way the stream ended as asked.
                return
            if _unanswered(err):
                raise _from_exception(err) from None
            raise

    def close(self) -> None:
        self._closed = True
        # Shutting the socket down (not just closing it) wakes a reader blocked in another thread.
        connection = getattr(self._response, "connection", None)
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._response.close()

    def __enter__(self) -> WatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def retry(
    call: Callable[[], T],
    what: str,
    *,
    deadline_s: float,
    on_conflict: Callable[[], None] | None = None,
    sleep: Callable[[float], object] = time.sleep,
) -> T:
    """Run `call`, retrying transient failures (and conflicts, after `on_conflict` refreshes
    whatever the call depends on) with exponential back-off until `deadline_s` has passed."""
    end, retries = time.monotonic() + deadline_s, Retries(API_CALL_RETRY)
    while True:
        try:
            return call()
        except ApiError as err:
            retryable = err.transient or (err.conflict and on_conflict is not None)
            delay = retries.failed()
            if not retryable or time.monotonic() + delay > end:
                raise
            log.info("retrying api call", call=what, error=str(err), retry_s=delay)
            sleep(delay)
            if err.conflict and on_conflict is not None:
                on_conflict()
