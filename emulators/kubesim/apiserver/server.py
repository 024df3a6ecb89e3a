"""`ApiServerEmulator`: the store, the API and the HTTP server together, with the knobs tests need."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from deviceplugin.logs import get_log
from kubesim.apiserver.api import Api
from kubesim.apiserver.errors import ApiError
from kubesim.apiserver.faults import FaultInjector
from kubesim.apiserver.kinds import BY_PLURAL, Kind
from kubesim.apiserver.kubeconfig import write_kubeconfig
from kubesim.apiserver.mergepatch import strategic_merge_patch
from kubesim.apiserver.meta import Obj, namespace_of
from kubesim.apiserver.requestlog import RequestLog
from kubesim.apiserver.store import DeleteOptions, Store
from kubesim.apiserver.transport import HttpServer

log = get_log(__name__)

_JOIN_TIMEOUT_S = 10.0


class ApiServerEmulator:
    """A Kubernetes API server for core/v1 pods, nodes, namespaces, events and configmaps, over HTTP.

    `faults` injects latency, errors and hangs; `requests` records every request; `drop_watches()`
    cuts every open watch; `compact()` makes older resourceVersions 410. `get`, `list`, `create`,
    `patch`, `bind` and `finish_deletion` reach the store directly, without HTTP (and without appearing
    in the request log), with the same semantics and watch events as the API.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        watch_history: int = 1000,
        bookmark_interval_s: float = 1.0,
        graceful_pod_deletion: bool = False,
    ) -> None:
        self._address = (host, port)
        self.store = Store(watch_history=watch_history, graceful_pod_deletion=graceful_pod_deletion)
        self.faults = FaultInjector()
        self.requests = RequestLog()
        self._api = Api(self.store, bookmark_interval_s=bookmark_interval_s, server_address=self._host_port)
        self._httpd: HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._lifecycle = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        with self._lifecycle:
            if self._httpd is not None:
                raise RuntimeError("an API server emulator starts once; make a new one")
            self._httpd = HttpServer(self._address, self._api, self.faults, self.requests)
            self._thread = threading.Thread(
                target=self._httpd.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="apiserver-http",
                daemon=True,
            )
            self._thread.start()
        log.info("api server emulator started", url=self.url)
        return self

    def stop(self) -> None:
        """End every watch and connection and join every thread; safe to call twice."""
        with self._lifecycle:
            httpd, thread = self._httpd, self._thread
            if httpd is None or thread is None:
                return
            self.faults.stop()
            self.store.close_watches()
            httpd.shutdown()
            httpd.close_connections()
            httpd.server_close()  # joins the handler threads
            thread.join(_JOIN_TIMEOUT_S)
            self._thread = None
        log.info("api server emulator stopped")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ addressing

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the API server emulator is not started")
        return int(self._httpd.server_address[1])

    @property
    def dropped_connections(self) -> int:
        """Connections their client reset mid-request (counted, not printed)."""
        return 0 if self._httpd is None else self._httpd.dropped

    @property
    def url(self) -> str:
        return f"http://{self._address[0]}:{self.port}"

    def _host_port(self) -> str:
        return f"{self._address[0]}:{self.port}"

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        return write_kubeconfig(path, self.url, namespace)

    # ------------------------------------------------------------------ test knobs

    @property
    def resource_version(self) -> int:
        return self.store.resource_version

    def compact(self) -> None:
        self.store.compact()

    def drop_watches(self) -> int:
        """Close every open watch connection abruptly (no final chunk); returns how many."""
        return self.store.end_watches("drop")

    def get(self, plural: str, name: str, namespace: str = "") -> Obj | None:
        """A copy of the stored object, or None."""
        kind = _kind(plural)
        try:
            return copy.deepcopy(self.store.get(kind, namespace if kind.namespaced else "", name))
        except ApiError as error:
            if error.code == 404:
                return None
            raise

    def list(self, plural: str, namespace: str = "") -> list[Obj]:
        items, _ = self.store.list(_kind(plural), namespace, lambda obj: True)
        return copy.deepcopy(items)

    def create(self, plural: str, obj: Obj) -> Obj:
        """Create as a POST would (defaults, validation, events), taking the namespace from the object."""
        kind = _kind(plural)
        namespace = (namespace_of(obj) or "default") if kind.namespaced else ""
        return copy.deepcopy(self.store.create(kind, namespace, obj))

    def patch(self, plural: str, name: str, patch: Obj, namespace: str = "", *, subresource: str = "") -> Obj:
        """A strategic merge patch, as a PATCH would apply it (`subresource="status"` for status)."""
        kind = _kind(plural)
        obj, _ = self.store.patch(
            kind,
            namespace if kind.namespaced else "",
            name,
            lambda current: strategic_merge_patch(current, patch, kind.merge_keys),
            subresource=subresource,
        )
        return copy.deepcopy(obj)

    def delete(self, plural: str, name: str, namespace: str = "", grace_period_s: int | None = 0) -> Obj:
        """Delete as a DELETE would (grace period 0 removes a pod at once)."""
        kind = _kind(plural)
        options = DeleteOptions(grace_period_s=grace_period_s)
        return copy.deepcopy(self.store.delete(kind, namespace if kind.namespaced else "", name, options))

    def bind(self, namespace: str, name: str, node: str, annotations: Mapping[str, str] | None = None) -> Obj:
        """Bind a pod to a node as a scheduler's Binding does."""
        return copy.deepcopy(self.store.bind(namespace, name, node, dict(annotations or {})))

    def finish_deletion(self, namespace: str, name: str) -> Obj:
        """Remove a terminating pod, as kubelet does once its containers are gone."""
        return copy.deepcopy(self.store.finish_deletion(BY_PLURAL["pods"], namespace, name))


def _kind(plural: str) -> Kind:
    kind = BY_PLURAL.get(plural)
    if kind is None:
        raise ValueError(f"the emulator does not serve {plural!r}; it serves {sorted(BY_PLURAL)}")
    return kind
