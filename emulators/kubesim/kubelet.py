"""Kubelet device-manager emulator over real gRPC on real Unix sockets.

Behaves like kubelet >= 1.25 (see reference/device-plugin-landscape.md §1.2-1.5):

- ``start()`` sweeps stale sockets out of the directory, then serves ``v1beta1.Registration`` on
  ``<dir>/kubelet.sock``.
- ``Register`` checks the version and the resource name, dials ``<dir>/<endpoint>`` *before* answering
  (a dial failure fails Register), reads ``GetDevicePluginOptions`` and opens one ``ListAndWatch`` stream
  with kubelet's 4 MiB receive limit. Each message replaces the resource's whole device set; when the
  stream breaks, every device of the resource turns unhealthy (capacity kept, allocatable 0).
- ``admit(pod)`` admits a pod like kubelet's device manager (``admission.py``): per container, init
  containers first, GetPreferredAllocation, one Allocate per container and resource (in Go's map
  order, or ``resource_order``), a checkpoint that kubelet replays instead of asking the plugin
  again. ``admit_batch(pods)`` admits one ADD batch in creation-time order.
- With ``pod_resources_socket``, ``v1.PodResourcesLister`` is served there (``podresources.py``); it
  shows the pod under admission with the devices it got so far. Setting
  ``rate_limit_while_admitting`` answers ``List`` calls made during an admission as over kubelet's
  rate limit (a fault for tests: a plugin cannot count on reaching ``List`` mid-admission).
- ``restart()`` does to the directory what a kubelet restart does: every socket goes, a new
  ``kubelet.sock`` (and pod-resources socket) appears and plugins must register again. The checkpoint,
  and so every admitted pod, survives.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import grpc

from deviceplugin.api import (
    HEALTHY,
    KUBELET_MAX_MESSAGE_BYTES,
    SUPPORTED_VERSIONS,
    UNHEALTHY,
    deviceplugin_grpc,
    podresources_grpc,
)
from deviceplugin.api import deviceplugin_pb2 as dp
from deviceplugin.logs import get_log
from kubesim.admission import Admission, Admitter, PluginCallError, PluginView, ResourceOrder
from kubesim.podresources import (
    POD_RESOURCES_BURST,
    POD_RESOURCES_QPS,
    Allocatable,
    CallCounter,
    PodResourcesCalls,
    PodResourcesService,
    TokenBucket,
)
from kubesim.signals import stop_signals

log = get_log(__name__)

KUBELET_SOCKET_NAME = "kubelet.sock"
#: Kubelet's own state file in the device-plugin directory; the start-up sweep never deletes it.
CHECKPOINT_NAME = "kubelet_internal_checkpoint"
#: Kubelet's blocking dial timeout for a registering plugin.
DIAL_TIMEOUT_S = 10.0

_JOIN_TIMEOUT_S = 5.0
_SERVER_THREADS = 8
_ABANDONED = "registration abandoned: kubelet restarted or stopped"

# Kubelet's IsExtendedResourceName: "requests.<name>" must be a qualified name (DNS-1123 subdomain
# prefix, "/", a name of at most 63 characters).
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_REQUESTS_PREFIX = "requests."


def is_extended_resource_name(name: str) -> bool:
    """Kubelet's test for a resource a device plugin may register."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith(_REQUESTS_PREFIX):
        return False
    prefix, _, short = (_REQUESTS_PREFIX + name).partition("/")
    return (
        len(prefix) <= 253
        and _DNS_SUBDOMAIN.fullmatch(prefix) is not None
        and len(short) <= 63
        and _QUALIFIED_NAME.fullmatch(short) is not None
    )


def cleanup_plugin_directory(directory: Path) -> list[Path]:
    """Kubelet's start-up sweep: delete every socket in `directory` but the checkpoint; keep all else."""
    removed: list[Path] = []
    for path in sorted(directory.iterdir()):
        if path.name == CHECKPOINT_NAME:
            continue
        try:
            if not stat.S_ISSOCK(path.stat().st_mode):
                continue
            path.unlink()
        except FileNotFoundError:  # its owner removed it meanwhile, or a dangling link
            continue
        removed.append(path)
    return removed


def status_text(error: grpc.RpcError) -> str:
    """An RPC error as kubelet logs it, e.g. ``rpc error: code = ResourceExhausted desc = ...``."""
    code = "".join(part.capitalize() for part in error.code().name.split("_"))
    return f"rpc error: code = {code} desc = {error.details()}"


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Registration:
    """One Register call and its outcome."""

    resource: str
    endpoint: str
    version: str
    #: ``RegisterRequest.options`` as sent (None when the field was unset).
    register_options: dp.DevicePluginOptions | None
    #: The plugin's ``GetDevicePluginOptions`` answer (None when Register failed before asking).
    plugin_options: dp.DevicePluginOptions | None
    #: ``time.monotonic()`` when Register answered.
    at: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class ResourceState:
    """What kubelet knows about one resource; an immutable snapshot, replaced on every change."""

    name: str
    endpoint: str
    #: From ``GetDevicePluginOptions``; this is what kubelet acts on.
    options: dp.DevicePluginOptions
    #: Device ID -> health string, as in the last ListAndWatch message.
    devices: Mapping[str, str]
    #: Device ID -> NUMA node IDs (empty when the device carried no topology).
    topology: Mapping[str, tuple[int, ...]]
    #: False once the stream ended or kubelet restarted, until the plugin registers again.
    connected: bool
    #: Why the ListAndWatch stream broke ("EOF" when the plugin ended it), None if it did not.
    stream_error: str | None
    #: ListAndWatch messages received on the current registration's stream.
    messages: int
    last_message_bytes: int
    #: ``time.monotonic()`` of the last change.
    updated_at: float

    @property
    def capacity(self) -> int:
        return len(self.devices)

    @property
    def healthy(self) -> tuple[str, ...]:
        """IDs of the healthy devices, in the plugin's order."""
        return tuple(device for device, health in self.devices.items() if health == HEALTHY)

    @property
    def allocatable(self) -> int:
        return len(self.healthy)


def _stopped(state: ResourceState, stream_error: str | None) -> ResourceState:
    # Kubelet's PluginDisconnected: every device unhealthy, so capacity stays and allocatable drops to 0.
    return replace(
        state,
        devices=dict.fromkeys(state.devices, UNHEALTHY),
        connected=False,
        stream_error=stream_error,
        updated_at=time.monotonic(),
    )


EventKind = Literal[
    "serving",
    "registered",
    "rejected",
    "devices",
    "disconnected",
    "restarted",
    "stopped",
    "admitted",
    "admission-failed",
    "released",
]
_COUNTED: frozenset[EventKind] = frozenset({"devices", "disconnected"})


@dataclass(frozen=True)
class KubeletEvent:
    """A state change, handed to the emulator's listener."""

    kind: EventKind
    resource: str = ""
    healthy: int = 0
    total: int = 0
    #: Free text, already in ``key=value`` form.
    detail: str = ""

    def __str__(self) -> str:
        parts: list[str] = [self.kind]
        if self.resource:
            parts.append(f"resource={self.resource}")
        if self.kind in _COUNTED:
            parts.append(f"healthy={self.healthy}/{self.total}")
        if self.detail:
            parts.append(self.detail)
        return " ".join(parts)


def _resource_event(kind: EventKind, state: ResourceState, detail: str = "") -> KubeletEvent:
    return KubeletEvent(kind, state.name, state.allocatable, state.capacity, detail)


# --------------------------------------------------------------------------- gRPC plumbing


class _Rejected(Exception):
    """Register fails with this text."""


class _Endpoint:
    """Kubelet's client for one registered plugin: the channel, its stub, the ListAndWatch stream."""

    def __init__(self, resource: str, channel: grpc.Channel) -> None:
        self.resource = resource
        self.channel = channel
        self.stub: Any = deviceplugin_grpc.DevicePluginStub(channel)
        self._call: Any = None
        self._thread: threading.Thread | None = None

    def watch(
        self,
        on_message: Callable[[_Endpoint, dp.ListAndWatchResponse], None],
        on_end: Callable[[_Endpoint, str], None],
    ) -> None:
        # Kubelet opens the stream with no deadline.
        self._call = self.stub.ListAndWatch(dp.Empty())
        self._thread = threading.Thread(
            target=self._run, args=(on_message, on_end), name=f"kubelet-watch {self.resource}", daemon=True
        )
        self._thread.start()

    def _run(
        self,
        on_message: Callable[[_Endpoint, dp.ListAndWatchResponse], None],
        on_end: Callable[[_Endpoint, str], None],
    ) -> None:
        error = "EOF"
        try:
            for response in self._call:
                on_message(self, response)
        except grpc.RpcError as exc:
            error = status_text(exc)
        on_end(self, error)

    def get_preferred_allocation(
        self, request: dp.PreferredAllocationRequest
    ) -> dp.PreferredAllocationResponse:
        response: dp.PreferredAllocationResponse = self._unary(self.stub.GetPreferredAllocation, request)
        return response

    def allocate(self, request: dp.AllocateRequest) -> dp.AllocateResponse:
        response: dp.AllocateResponse = self._unary(self.stub.Allocate, request)
        return response

    def _unary(self, method: Any, request: Any) -> Any:
        # No deadline, like kubelet; restart() and stop() close the channel, which cancels the call.
        try:
            return method(request)
        except grpc.RpcError as exc:
            raise PluginCallError(status_text(exc)) from exc
        except ValueError as exc:  # grpc's "closed channel": kubelet let go of the plugin meanwhile
            raise PluginCallError(f"endpoint {self.resource} has been stopped") from exc

    def cancel(self) -> None:
        """End the stream now (fast, unlike closing the channel)."""
        if self._call is not None:
            self._call.cancel()

    def close(self) -> None:
        self.cancel()
        # Up to 0.2 s while grpc's connectivity poller, left by the dial, is still running.
        self.channel.close()

    def join(self) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(_JOIN_TIMEOUT_S)


class _RegistrationService(deviceplugin_grpc.RegistrationServicer):
    def __init__(self, register: Callable[[dp.RegisterRequest], str | None]) -> None:
        self._register = register

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        error = self._register(request)
        if error is not None:
            # Kubelet returns a plain Go error, which gRPC delivers as UNKNOWN.
            context.abort(grpc.StatusCode.UNKNOWN, error)
        return dp.Empty()


class _UnixServer:
    """A started gRPC server on a Unix socket with its own pool, so stopping it joins every handler."""

    def __init__(self, path: Path, add_services: Callable[[grpc.Server], None], name: str) -> None:
        self._executor = futures.ThreadPoolExecutor(_SERVER_THREADS, thread_name_prefix=name)
        self._server = grpc.server(self._executor)
        add_services(self._server)
        self._server.add_insecure_port(f"unix:{path}")
        self._server.start()

    def stop(self) -> None:
        # grpc also unlinks the socket file here.
        self._server.stop(grace=None).wait()
        self._executor.shutdown(wait=True)


def _pin_inode(path: Path) -> int | None:
    """Hold `path`'s inode allocated (ext4 hands a freed inode number straight back), or None if absent."""
    try:
        return os.open(path, os.O_PATH)
    except FileNotFoundError:
        return None


# --------------------------------------------------------------------------- the emulator


class KubeletEmulator:
    """Kubelet's device manager (registration, ListAndWatch, admission) serving `directory`.

    All registration state sits behind one re-entrant lock and its condition; readers get immutable
    snapshots. Admission keeps its checkpoint behind its own lock and calls plugins with neither held.
    `listener` is called under the state lock on every change, in order: keep it quick, and do not call
    `admit()`, `restart()` or `stop()` from it. Call `start()`/`restart()`/`stop()` from one
    controlling thread; `admit()` from any (admissions run one at a time).

    `pod_resources_socket`, when given, serves ``v1.PodResourcesLister`` with kubelet's rate limit
    (`pod_resources_qps`, `pod_resources_burst`). `resource_order` orders each container's Allocate
    calls (default: shuffled like a Go map, seeded).
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_receive_bytes: int = KUBELET_MAX_MESSAGE_BYTES,
        dial_timeout_s: float = DIAL_TIMEOUT_S,
        listener: Callable[[KubeletEvent], None] | None = None,
        pod_resources_socket: Path | None = None,
        pod_resources_qps: float = POD_RESOURCES_QPS,
        pod_resources_burst: int = POD_RESOURCES_BURST,
        resource_order: ResourceOrder | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.socket_path = self.directory / KUBELET_SOCKET_NAME
        self.pod_resources_socket = None if pod_resources_socket is None else Path(pod_resources_socket)
        self._max_receive_bytes = max_receive_bytes
        self._dial_timeout_s = dial_timeout_s
        self._listener = listener
        self._pod_resources_limit = (pod_resources_qps, pod_resources_burst)
        self._pod_resources_calls = CallCounter()
        self._cond = threading.Condition(threading.RLock())
        self._servers: list[_UnixServer] = []
        # Bumped when kubelet goes away (restart, stop): registrations begun before are void.
        self._epoch = 0
        self._generation = 0
        self._restarts = 0
        self._socket_created_at: float | None = None
        self._resources: dict[str, ResourceState] = {}
        self._endpoints: dict[str, _Endpoint] = {}
        self._registrations: list[Registration] = []
        # Dials and GetDevicePluginOptions calls in flight, cancelled when kubelet goes away.
        self._pending: set[Any] = set()
        # Kubelet's checkpoint outlives restarts: it is kept on disk.
        self._admitter = Admitter(self._plugin_view, self._on_admission, resource_order)
        #: Fault: pod-resources calls made while a pod is admitted are refused as rate-limited.
        self.rate_limit_while_admitting = False

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        with self._cond:
            if self._servers:
                raise RuntimeError("kubelet emulator already running")
        self.directory.mkdir(parents=True, exist_ok=True)
        detail = f"path={self.socket_path}"
        if self.pod_resources_socket is not None:
            self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
            detail += f" pod-resources={self.pod_resources_socket}"
        self._serve()
        self._emit(KubeletEvent("serving", detail=detail))

    def restart(self) -> None:
        """Kubelet restart: streams closed, every socket deleted, new sockets (new inodes)."""
        with self._cond:
            if not self._servers:
                raise RuntimeError("kubelet emulator is not running")
        pins = [pin for pin in map(_pin_inode, self._socket_paths()) if pin is not None]
        try:
            self._shut_down()
            self._serve()
        finally:
            for pin in pins:
                os.close(pin)
        with self._cond:
            self._restarts += 1
            self._emit(KubeletEvent("restarted", detail=f"restarts={self._restarts} path={self.socket_path}"))

    def stop(self) -> None:
        """Stop serving and close every stream; removes kubelet's sockets. Idempotent."""
        with self._cond:
            if not self._servers:
                return
        self._shut_down()
        for path in self._socket_paths():
            path.unlink(missing_ok=True)
        self._emit(KubeletEvent("stopped"))

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _serve(self) -> None:
        removed = cleanup_plugin_directory(self.directory)
        if removed:
            log.info("removed stale sockets", paths=[path.name for path in removed])
        servers = [self._serve_registration()]
        if self.pod_resources_socket is not None:
            try:
                servers.append(self._serve_pod_resources(self.pod_resources_socket))
            except BaseException:
                servers[0].stop()  # e.g. a pod-resources path too long for a Unix socket
                raise
        with self._cond:
            self._servers = servers
            self._socket_created_at = time.monotonic()

    def _serve_registration(self) -> _UnixServer:
        service = _RegistrationService(self._register)
        return _UnixServer(
            self.socket_path,
            lambda grpc_server: deviceplugin_grpc.add_RegistrationServicer_to_server(service, grpc_server),
            "kubelet-registration",
        )

    def _serve_pod_resources(self, path: Path) -> _UnixServer:
        # A fresh kubelet process has a full token bucket; the call counts carry on across restarts.
        service = PodResourcesService(
            self._admitter.listed,
            self._allocatable,
            TokenBucket(*self._pod_resources_limit),
            self._pod_resources_calls,
            refused=lambda: self.rate_limit_while_admitting and self._admitter.admitting,
        )
        return _UnixServer(
            path,
            lambda grpc_server: podresources_grpc.add_PodResourcesListerServicer_to_server(
                service, grpc_server
            ),
            "kubelet-podresources",
        )

    def _socket_paths(self) -> list[Path]:
        paths = [self.socket_path]
        if self.pod_resources_socket is not None:
            paths.append(self.pod_resources_socket)
        return paths

    def _shut_down(self) -> None:
        with self._cond:
            self._epoch += 1
            for future in self._pending:
                future.cancel()
            servers, self._servers = self._servers, []
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
            for endpoint in endpoints:
                endpoint.cancel()
            for name, state in self._resources.items():
                self._resources[name] = _stopped(state, state.stream_error)
            self._changed()
        for server in servers:
            server.stop()
        for endpoint in endpoints:
            endpoint.close()
        for endpoint in endpoints:
            endpoint.join()

    # ---------------------------------------------------------------- state

    @property
    def generation(self) -> int:
        """Counts state changes; `wait_for` wakes on each."""
        with self._cond:
            return self._generation

    @property
    def restarts(self) -> int:
        with self._cond:
            return self._restarts

    @property
    def socket_created_at(self) -> float | None:
        """``time.monotonic()`` when the current kubelet.sock appeared."""
        with self._cond:
            return self._socket_created_at

    @property
    def registrations(self) -> tuple[Registration, ...]:
        with self._cond:
            return tuple(self._registrations)

    @property
    def resources(self) -> dict[str, ResourceState]:
        with self._cond:
            return dict(self._resources)

    def resource(self, name: str) -> ResourceState | None:
        with self._cond:
            return self._resources.get(name)

    @property
    def pod_resources_calls(self) -> PodResourcesCalls:
        """Requests that reached the pod-resources socket, over every restart."""
        return self._pod_resources_calls.snapshot()

    def wait_for(self, predicate: Callable[[KubeletEmulator], bool], timeout_s: float) -> bool:
        """Block until `predicate(self)` holds (checked on every change) or `timeout_s` passes."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self), timeout=timeout_s)

    def _changed(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def _emit(self, event: KubeletEvent) -> None:
        with self._cond:
            self._changed()
            log.debug("kubelet event", event=str(event))
            if self._listener is not None:
                self._listener(event)

    # ---------------------------------------------------------------- admission

    def admit(self, pod: Mapping[str, Any], resource_order: Sequence[str] = ()) -> Admission:
        """Admit `pod` (Kubernetes JSON) like kubelet's device manager; see `kubesim.admission`.
        `resource_order` names resources whose Allocate comes first, in that order."""
        return self._admitter.admit(pod, resource_order)

    def admit_batch(self, pods: Sequence[Mapping[str, Any]]) -> list[Admission]:
        """Admit one ADD batch (as after a kubelet restart): creation-time order, one pod at a time."""
        return self._admitter.admit_batch(pods)

    def reallocate(self, pod_uid: str, container: str, resource: str) -> dp.ContainerAllocateResponse:
        """Send Allocate again with the checkpointed device IDs; returns and checkpoints the new response."""
        return self._admitter.reallocate(pod_uid, container, resource)

    def release(self, pod_uid: str) -> bool:
        """The pod is gone: free its devices, drop its checkpoint entries (kubelet's garbage collection)."""
        admission = self._admitter.forget(pod_uid)
        if admission is None:
            return False
        self._emit(KubeletEvent("released", detail=f"pod={admission.pod.key} uid={pod_uid}"))
        return True

    @property
    def admissions(self) -> tuple[Admission, ...]:
        """Every admitted pod, in admission order, as the checkpoint holds it."""
        return self._admitter.admissions()

    def admission(self, pod_uid: str) -> Admission | None:
        return self._admitter.admission(pod_uid)

    def in_use(self, resource: str) -> dict[str, str]:
        """Device ID -> UID of the admitted pod holding it."""
        return self._admitter.in_use(resource)

    def _plugin_view(self, resource: str) -> PluginView | None:
        with self._cond:
            state = self._resources.get(resource)
            if state is None:
                return None
            return PluginView(
                healthy=frozenset(state.healthy),
                topology=state.topology,
                preferred_available=state.options.get_preferred_allocation_available,
                endpoint=self._endpoints.get(resource),
            )

    def _allocatable(self) -> Allocatable:
        with self._cond:
            return {
                name: {device: state.topology.get(device, ()) for device in state.healthy}
                for name, state in self._resources.items()
            }

    def _on_admission(self, admission: Admission) -> None:
        self._emit(
            KubeletEvent("admitted" if admission.admitted else "admission-failed", detail=str(admission))
        )

    # ---------------------------------------------------------------- Register

    def _register(self, request: dp.RegisterRequest) -> str | None:
        """Kubelet's Register handler; returns the error text, None on success."""
        with self._cond:
            epoch = self._epoch
        endpoint: _Endpoint | None = None
        options: dp.DevicePluginOptions | None = None
        error: str | None = None
        try:
            _validate(request)
            endpoint = self._open(request)
            self._dial(endpoint, request, epoch)
            options = self._plugin_options(endpoint, epoch)
            self._install(request, endpoint, options, epoch)
        except _Rejected as exc:
            error = str(exc)
            if endpoint is not None:
                endpoint.close()
        self._record(request, options, error)
        return error

    def _open(self, request: dp.RegisterRequest) -> _Endpoint:
        channel_options = [
            ("grpc.max_receive_message_length", self._max_receive_bytes),
            ("grpc.default_authority", "localhost"),
        ]
        path = self.directory / request.endpoint
        return _Endpoint(request.resource_name, grpc.insecure_channel(f"unix:{path}", channel_options))

    def _dial(self, endpoint: _Endpoint, request: dp.RegisterRequest, epoch: int) -> None:
        """Kubelet's blocking dial: wait until the plugin's socket answers."""
        try:
            self._await(grpc.channel_ready_future(endpoint.channel), self._dial_timeout_s, epoch)
        except grpc.FutureTimeoutError as exc:
            path = self.directory / request.endpoint
            raise _Rejected(
                f"failed to dial device plugin: {path} did not answer within {self._dial_timeout_s:g} s"
            ) from exc

    def _plugin_options(self, endpoint: _Endpoint, epoch: int) -> dp.DevicePluginOptions:
        # No deadline, like kubelet; stop() and restart() cancel it instead.
        try:
            options: dp.DevicePluginOptions = self._await(
                endpoint.stub.GetDevicePluginOptions.future(dp.Empty()), None, epoch
            )
        except grpc.RpcError as exc:
            raise _Rejected(f"failed to get device plugin options: {status_text(exc)}") from exc
        return options

    def _await(self, future: Any, timeout_s: float | None, epoch: int) -> Any:
        """Result of a gRPC future that kubelet going away cancels."""
        with self._cond:
            if epoch != self._epoch:
                future.cancel()
            self._pending.add(future)
        try:
            return future.result(timeout=timeout_s)
        except grpc.FutureCancelledError as exc:
            raise _Rejected(_ABANDONED) from exc
        finally:
            with self._cond:
                self._pending.discard(future)

    def _install(
        self, request: dp.RegisterRequest, endpoint: _Endpoint, options: dp.DevicePluginOptions, epoch: int
    ) -> None:
        name = request.resource_name
        with self._cond:
            if epoch != self._epoch:
                raise _Rejected(_ABANDONED)
            old = self._endpoints.pop(name, None)
            if old is not None:
                old.cancel()  # the replaced plugin's stream ends before the new one opens
            previous = self._resources.get(name)
            state = ResourceState(
                name=name,
                endpoint=request.endpoint,
                options=options,
                # Kubelet keeps the last known devices until the new stream's first message.
                devices=previous.devices if previous else {},
                topology=previous.topology if previous else {},
                connected=True,
                stream_error=None,
                messages=0,
                last_message_bytes=0,
                updated_at=time.monotonic(),
            )
            self._resources[name] = state
            self._endpoints[name] = endpoint
            endpoint.watch(self._on_message, self._on_stream_end)
            self._emit(_resource_event("registered", state, f"endpoint={request.endpoint}"))
        if old is not None:
            old.close()
            old.join()

    def _record(
        self, request: dp.RegisterRequest, options: dp.DevicePluginOptions | None, error: str | None
    ) -> None:
        record = Registration(
            resource=request.resource_name,
            endpoint=request.endpoint,
            version=request.version,
            register_options=request.options if request.HasField("options") else None,
            plugin_options=options,
            at=time.monotonic(),
            error=error,
        )
        with self._cond:
            self._registrations.append(record)
            if error is None:
                self._changed()
            else:
                self._emit(KubeletEvent("rejected", request.resource_name, detail=f"error={error!r}"))

    # ---------------------------------------------------------------- ListAndWatch

    def _current(self, endpoint: _Endpoint) -> ResourceState | None:
        """The endpoint's resource, or None if kubelet has let go of that endpoint."""
        if self._endpoints.get(endpoint.resource) is not endpoint:
            return None
        return self._resources[endpoint.resource]

    def _on_message(self, endpoint: _Endpoint, response: dp.ListAndWatchResponse) -> None:
        devices = {device.ID: device.health for device in response.devices}
        topology = {
            device.ID: tuple(node.ID for node in device.topology.nodes) for device in response.devices
        }
        size = response.ByteSize()
        with self._cond:
            state = self._current(endpoint)
            if state is None:
                return
            state = replace(
                state,
                devices=devices,
                topology=topology,
                messages=state.messages + 1,
                last_message_bytes=size,
                updated_at=time.monotonic(),
            )
            self._resources[state.name] = state
            self._emit(_resource_event("devices", state))

    def _on_stream_end(self, endpoint: _Endpoint, error: str) -> None:
        with self._cond:
            state = self._current(endpoint)
            if state is None:
                return  # kubelet closed it itself (re-registration, restart, stop)
            del self._endpoints[endpoint.resource]
            state = _stopped(state, error)
            self._resources[state.name] = state
            self._emit(_resource_event("disconnected", state, f"error={error!r}"))
        endpoint.close()


def _validate(request: dp.RegisterRequest) -> None:
    if request.version not in SUPPORTED_VERSIONS:
        supported = ", ".join(f'"{version}"' for version in SUPPORTED_VERSIONS)
        raise _Rejected(
            f'requested API version "{request.version}" is not supported by kubelet. '
            f"Supported version is [{supported}]"
        )
    if not is_extended_resource_name(request.resource_name):
        raise _Rejected(f'the ResourceName "{request.resource_name}" is invalid')


# --------------------------------------------------------------------------- foreground runner


def _print_event(event: KubeletEvent) -> None:
    print(event, flush=True)


def run_kubelet(directory: Path, *, pod_resources_socket: Path | None = None) -> int:
    """`deviceplugin sim kubelet --dir DIR`: one stdout line per event until SIGTERM or SIGINT."""
    emulator = KubeletEmulator(directory, listener=_print_event, pod_resources_socket=pod_resources_socket)
    with stop_signals() as wait_for_signal, emulator:
        wait_for_signal()
    return 0
