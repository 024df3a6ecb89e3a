"""Keeps every resource served and registered across kubelet restarts.

Kubelet deletes every socket in the device-plugin directory when it starts and then creates a new
`kubelet.sock`. The registrar notices either event within one poll (100 ms), re-serves what lost
its socket and registers everything with the new kubelet. Failed registrations back off
exponentially (capped), so an absent or broken kubelet is not hammered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from deviceplugin.backoff import Backoff, Retries
from deviceplugin.logs import get_log
from deviceplugin.plugin.server import PluginServer, socket_identity
from deviceplugin.supervisor import Supervisor
from deviceplugin.worker import Worker

log = get_log(__name__)

POLL_S = 0.1
# Between failed serves or registrations: an absent or broken kubelet is not hammered, and one
# that comes back is registered with within seconds.
REGISTRATION_RETRY = Backoff(start_s=0.2, max_s=10.0)


class Registrar:
    def __init__(
        self,
        servers: Sequence[PluginServer],
        kubelet_socket: Path,
        on_registered: Callable[[], None] | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.servers = tuple(servers)
        self.kubelet_socket = kubelet_socket
        self.on_registered = on_registered  # after every successful (re-)registration
        self._registered_with: tuple[int, int] | None = None
        self._worker = Worker("registrar", self._run, supervisor=supervisor)
        self._retries = Retries(REGISTRATION_RETRY)
        self._waiting_logged = False
        self.registrations: Counter[str] = Counter()  # successful Register calls per resource

    @property
    def registered(self) -> bool:
        """Registered with the kubelet whose socket is in place now."""
        current = socket_identity(self.kubelet_socket)
        return current is not None and current == self._registered_with

    def start(self) -> None:
        for server in self.servers:
            server.start()
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()
        for server in self.servers:
            server.stop()

    def _run(self) -> None:
        delay = 0.0
        while not self._worker.stopping.wait(delay):
            delay = self.step()
            self._worker.turn()

    def _retry_later(self, what: str, err: Exception) -> float:
        detail = err.details() if isinstance(err, grpc.RpcError) else str(err)
        delay = self._retries.failed()
        log.warning(f"{what} failed", error=detail or type(err).__name__, retry_s=delay)
        return delay

    def step(self) -> float:
        """One pass; returns how long to wait before the next."""
        for server in self.servers:
            if server.serving():
                continue
            log.info("socket gone, serving again", resource=server.resource_name)
            try:
                server.start()
            except (grpc.RpcError, OSError, RuntimeError) as err:
                return self._retry_later("serving", err)
            self._registered_with = None  # a new socket must be registered again
        kubelet = socket_identity(self.kubelet_socket)
        if kubelet is None:
            if not self._waiting_logged:
                log.warning("waiting for kubelet", socket=str(self.kubelet_socket))
                self._waiting_logged = True
            self._registered_with = None
            return POLL_S
        if kubelet == self._registered_with:
            return POLL_S
        try:
            for server in self.servers:
                server.register(self.kubelet_socket)
                self.registrations[server.resource_name] += 1
        except grpc.RpcError as err:
            return self._retry_later("registration", err)
        self._registered_with = kubelet
        self._retries.succeeded()
        self._waiting_logged = False
        if self.on_registered is not None:
            self.on_registered()
        return POLL_S
