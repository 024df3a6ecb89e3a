"""One resource's gRPC server on its Unix socket, and its registration with kubelet."""

from __future__ import annotations

import contextlib
import os
import stat
from concurrent import futures
from pathlib import Path

import grpc

from deviceplugin.api import VERSION, deviceplugin_grpc
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.logs import get_log
from deviceplugin.plugin.service import OPTIONS, DevicePluginService

log = get_log(__name__)

# GetPreferredAllocation carries every available device ID: far beyond gRPC's 4 MiB default.
MAX_RECEIVE_BYTES = 64 * 1024 * 1024
SELF_CHECK_TIMEOUT_S = 2.0
# Kubelet dials the plugin back inside Register and waits up to 10 s for it.
REGISTER_TIMEOUT_S = 12.0
# One thread per open ListAndWatch stream, plus room for kubelet's unary calls.
WORKERS = 8
STOP_GRACE_S = 0.5


def socket_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a socket file, None when there is none: a recreated socket differs."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISSOCK(info.st_mode) else None


class PluginServer:
    """Serves a `DevicePluginService` on `<directory>/<resource socket>`."""

    def __init__(self, service: DevicePluginService, directory: Path) -> None:
        self.service = service
        self.path = directory / service.devices.resource.socket
        self._server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._identity: tuple[int, int] | None = None

    @property
    def resource_name(self) -> str:
        return self.service.resource_name

    def start(self) -> None:
        """Remove a stale socket, serve, restrict the socket to its owner, prove it answers."""
        self.stop()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.service.stopping.clear()
        self._executor = futures.ThreadPoolExecutor(
            max_workers=WORKERS, thread_name_prefix=f"dp-{self.path.stem}"
        )
        server = grpc.server(
            self._executor,
            handlers=[self.service.handler()],
            options=[("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)],
        )
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._server = server
        os.chmod(self.path, 0o600)
        self._identity = socket_identity(self.path)
        self._self_check()
        log.info("serving", resource=self.resource_name, socket=str(self.path))

    def _self_check(self) -> None:
        with grpc.insecure_channel(f"unix://{self.path}") as channel:
            stub = deviceplugin_grpc.DevicePluginStub(channel)
            stub.GetDevicePluginOptions(pb.Empty(), timeout=SELF_CHECK_TIMEOUT_S)

    def serving(self) -> bool:
        """Whether our socket is still in place (kubelet deletes every socket when it restarts)."""
        return self._server is not None and socket_identity(self.path) == self._identity

    def register(self, kubelet_socket: Path) -> None:
        """Announce the resource to kubelet, which dials back before answering."""
        request = pb.RegisterRequest(
            version=VERSION, endpoint=self.path.name, resource_name=self.resource_name, options=OPTIONS
        )
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            deviceplugin_grpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT_S)
        log.info("registered with kubelet", resource=self.resource_name, endpoint=self.path.name)

    def stop(self) -> None:
        """Stop serving (ending ListAndWatch streams) and remove our socket if it is still ours."""
        if self._server is None:
            return
        self.service.stopping.set()
        self.service.health.wake()
        self._server.stop(STOP_GRACE_S).wait()
        self._server = None
        if self._executor is not None:  # grpc leaves the pool's threads running
            self._executor.shutdown(wait=True)
            self._executor = None
        if socket_identity(self.path) == self._identity:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._identity = None
