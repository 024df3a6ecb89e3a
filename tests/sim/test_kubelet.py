"""Kubelet emulator, registration side: real gRPC on real Unix sockets against an in-test plugin."""

from __future__ import annotations

import queue
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.api import HEALTHY, KUBELET_MAX_MESSAGE_BYTES, UNHEALTHY, VERSION, deviceplugin_grpc
from deviceplugin.api import deviceplugin_pb2 as dp
from kubesim.kubelet import (
    CHECKPOINT_NAME,
    KUBELET_SOCKET_NAME,
    KubeletEmulator,
    KubeletEvent,
    ResourceState,
)
from kubesim.scratch import scratch_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
RESOURCE = "nvidia.com/gpu"
ENDPOINT = "gpu.sock"
WAIT_S = 5.0
DIAL_TIMEOUT_S = 0.5
PLUGIN_OPTIONS = dp.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)
# Deliberately different from PLUGIN_OPTIONS: kubelet must act on GetDevicePluginOptions.
REGISTER_OPTIONS = dp.DevicePluginOptions(get_preferred_allocation_available=False)

RegistrationStub: Callable[[grpc.Channel], Any] = deviceplugin_grpc.RegistrationStub


# --------------------------------------------------------------------------- in-test device plugin


class FakePlugin(deviceplugin_grpc.DevicePluginServicer):
    """Sends the latest published device list on every ListAndWatch stream, then each new one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._devices: list[dp.Device] = []
        self._version = 0
        self._finished = False
        self.streams = 0
        self.active_streams = 0

    def publish(self, devices: Sequence[dp.Device]) -> None:
        with self._cond:
            self._devices = list(devices)
            self._version += 1
            self._cond.notify_all()

    def finish(self) -> None:
        """Return from every ListAndWatch, as a plugin shutting its stream down cleanly."""
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def wait_active_streams(self, count: int) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.active_streams == count, timeout=WAIT_S)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def GetDevicePluginOptions(
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> dp.DevicePluginOptions:
        return PLUGIN_OPTIONS

    def ListAndWatch(
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> Iterator[dp.ListAndWatchResponse]:
        context.add_callback(self._wake)
        with self._cond:
            self.streams += 1
            self.active_streams += 1
        try:
            yield from self._updates(context)
        finally:
            with self._cond:
                self.active_streams -= 1
                self._cond.notify_all()

    def _updates(self, context: grpc.ServicerContext) -> Iterator[dp.ListAndWatchResponse]:
        sent = 0

        def due() -> bool:
            return self._version > sent or self._finished or not context.is_active()

        while True:
            with self._cond:
                self._cond.wait_for(due)
                if self._finished or not context.is_active():
                    return
                sent, devices = self._version, self._devices
            yield dp.ListAndWatchResponse(devices=devices)


class OptionlessPlugin(FakePlugin):
    def GetDevicePluginOptions(
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> dp.DevicePluginOptions:
        context.abort(grpc.StatusCode.INTERNAL, "options unavailable")
        raise AssertionError("unreachable: abort raises")


class PluginServer:
    """A FakePlugin served on `<directory>/<endpoint>`; can be stopped and started again."""

    def __init__(self, directory: Path, endpoint: str = ENDPOINT, servicer: FakePlugin | None = None) -> None:
        self.path = directory / endpoint
        self.servicer = servicer or FakePlugin()
        self._server: Any = None
        self._executor: futures.ThreadPoolExecutor | None = None

    def start(self) -> None:
        self._executor = futures.ThreadPoolExecutor(4, thread_name_prefix="test-plugin")
        self._server = grpc.server(self._executor)
        deviceplugin_grpc.add_DevicePluginServicer_to_server(self.servicer, self._server)
        self._server.add_insecure_port(f"unix:{self.path}")
        self._server.start()

    def stop(self) -> None:
        if self._server is not None and self._executor is not None:
            self._server.stop(grace=None).wait()
            self._executor.shutdown(wait=True)
            self._server = self._executor = None


def device(device_id: str, health: str = HEALTHY, numa: Sequence[int] = ()) -> dp.Device:
    built = dp.Device(ID=device_id, health=health)
    if numa:
        built.topology.nodes.extend(dp.NUMANode(ID=node) for node in numa)
    return built


def devices_of_size(total_bytes: int) -> list[dp.Device]:
    """Healthy devices whose ListAndWatchResponse is exactly `total_bytes` long on the wire."""
    entry = 64  # a 51-character ID: 2 + 51 (ID) + 2 + 7 (health) + 2 (entry header)
    count, extra = divmod(total_bytes, entry)
    built = [device(f"GPU-{index:08d}".ljust(51, "x")) for index in range(count)]
    built[-1].ID += "y" * extra
    assert dp.ListAndWatchResponse(devices=built).ByteSize() == total_bytes
    return built


def register(
    directory: Path,
    resource: str = RESOURCE,
    endpoint: str = ENDPOINT,
    *,
    version: str = VERSION,
    options: dp.DevicePluginOptions | None = None,
) -> None:
    request = dp.RegisterRequest(version=version, endpoint=endpoint, resource_name=resource, options=options)
    with grpc.insecure_channel(f"unix:{directory / KUBELET_SOCKET_NAME}") as channel:
        RegistrationStub(channel).Register(request, timeout=WAIT_S)


def state_of(kubelet: KubeletEmulator, resource: str = RESOURCE) -> ResourceState:
    state = kubelet.resource(resource)
    assert state is not None
    return state


def settle(
    kubelet: KubeletEmulator, check: Callable[[ResourceState], bool], resource: str = RESOURCE
) -> None:
    def ready(emulator: KubeletEmulator) -> bool:
        state = emulator.resource(resource)
        return state is not None and check(state)

    assert kubelet.wait_for(ready, WAIT_S), kubelet.resource(resource)


def make_stale_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
    with scratch_dir("kl-") as path:
        yield path


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[KubeletEmulator]:
    with KubeletEmulator(plugin_dir, dial_timeout_s=DIAL_TIMEOUT_S) as emulator:
        yield emulator


@pytest.fixture
def plugin(kubelet: KubeletEmulator) -> Iterator[PluginServer]:
    # After the kubelet: its start-up sweep would delete the plugin's socket.
    server = PluginServer(kubelet.directory)
    server.start()
    yield server
    server.stop()


# --------------------------------------------------------------------------- registration


def test_register_reads_plugin_options_and_records_both(
    kubelet: KubeletEmulator, plugin: PluginServer
) -> None:
    register(kubelet.directory, options=REGISTER_OPTIONS)
    (record,) = kubelet.registrations
    assert record.ok and record.error is None
    assert (record.resource, record.endpoint, record.version) == (RESOURCE, ENDPOINT, VERSION)
    assert record.register_options == REGISTER_OPTIONS
    assert record.plugin_options == PLUGIN_OPTIONS
    state = state_of(kubelet)
    assert state.options == PLUGIN_OPTIONS
    assert state.connected and state.endpoint == ENDPOINT and state.capacity == 0

    register(kubelet.directory)
    assert kubelet.registrations[-1].register_options is None


def test_devices_follow_every_message(kubelet: KubeletEmulator, plugin: PluginServer) -> None:
    first = [device("GPU-0", numa=[0]), device("GPU-1", numa=[1]), device("GPU-2")]
    plugin.servicer.publish(first)
    register(kubelet.directory)
    settle(kubelet, lambda state: state.messages == 1)
    state = state_of(kubelet)
    assert state.devices == {"GPU-0": HEALTHY, "GPU-1": HEALTHY, "GPU-2": HEALTHY}
    assert state.topology == {"GPU-0": (0,), "GPU-1": (1,), "GPU-2": ()}
    assert (state.capacity, state.allocatable) == (3, 3)
    assert state.last_message_bytes == dp.ListAndWatchResponse(devices=first).ByteSize()

    generation = kubelet.generation
    plugin.servicer.publish([device("GPU-0", numa=[0]), device("GPU-1", UNHEALTHY, [1]), device("GPU-2")])
    settle(kubelet, lambda state: state.messages == 2)
    assert kubelet.generation > generation
    flipped = state_of(kubelet)
    assert flipped.devices["GPU-1"] == UNHEALTHY
    assert (flipped.capacity, flipped.allocatable) == (3, 2)
    assert flipped.updated_at > state.updated_at

    plugin.servicer.publish(first)
    settle(kubelet, lambda state: state.messages == 3)
    assert (state_of(kubelet).capacity, state_of(kubelet).allocatable) == (3, 3)

    # Every message replaces the whole set: devices left out are gone.
    plugin.servicer.publish([device("GPU-2", numa=[0, 1])])
    settle(kubelet, lambda state: state.messages == 4)
    state = state_of(kubelet)
    assert state.devices == {"GPU-2": HEALTHY}
    assert state.topology == {"GPU-2": (0, 1)}
    assert (state.capacity, state.allocatable) == (1, 1)


def test_wrong_version_is_rejected(kubelet: KubeletEmulator, plugin: PluginServer) -> None:
    with pytest.raises(grpc.RpcError) as error:
        register(kubelet.directory, version="v1alpha")
    assert error.value.code() == grpc.StatusCode.UNKNOWN
    assert '"v1alpha" is not supported' in error.value.details()
    (record,) = kubelet.registrations
    assert not record.ok and record.error == error.value.details()
    assert record.plugin_options is None
    assert kubelet.resource(RESOURCE) is None and plugin.servicer.streams == 0


@pytest.mark.parametrize(
    ("name", "accepted"),
    [
        ("nvidia.com/gpu", True),
        ("volcano.sh/gpu-memory", True),
        # Kubelet checks that "requests.<name>" is a qualified name: no dot needed in the domain.
        ("example/gpu", True),
        ("gpu", False),
        ("kubernetes.io/foo", False),
        ("gpu.kubernetes.io/foo", False),
        ("requests.x/y", False),
        ("Nvidia.com/gpu", False),
        ("nvidia.com/", False),
        ("nvidia.com/a/b", False),
        ("nvidia.com/" + "g" * 64, False),
    ],
)
def test_only_extended_resource_names_register(
    kubelet: KubeletEmulator, plugin: PluginServer, name: str, accepted: bool
) -> None:
    if accepted:
        register(kubelet.directory, name)
        assert list(kubelet.resources) == [name] and state_of(kubelet, name).connected
        return
    with pytest.raises(grpc.RpcError) as error:
        register(kubelet.directory, name)
    assert error.value.code() == grpc.StatusCode.UNKNOWN
    assert error.value.details() == f'the ResourceName "{name}" is invalid'
    assert kubelet.resource(name) is None


def test_register_fails_when_nobody_serves_the_endpoint(kubelet: KubeletEmulator) -> None:
    with pytest.raises(grpc.RpcError) as error:
        register(kubelet.directory, endpoint="nobody.sock")
    # The dial happens inside Register and waits out the whole timeout.
    path = kubelet.directory / "nobody.sock"
    assert error.value.details() == (
        f"failed to dial device plugin: {path} did not answer within {DIAL_TIMEOUT_S:g} s"
    )
    (record,) = kubelet.registrations
    assert not record.ok and "nobody.sock" in (record.error or "")
    assert kubelet.resource(RESOURCE) is None


def test_register_fails_when_options_cannot_be_read(kubelet: KubeletEmulator) -> None:
    server = PluginServer(kubelet.directory, servicer=OptionlessPlugin())
    server.start()
    try:
        with pytest.raises(grpc.RpcError) as error:
            register(kubelet.directory)
    finally:
        server.stop()
    assert error.value.details().startswith("failed to get device plugin options: rpc error: code = Internal")
    assert kubelet.resource(RESOURCE) is None


def test_reregistration_replaces_the_old_stream(kubelet: KubeletEmulator, plugin: PluginServer) -> None:
    plugin.servicer.publish([device("GPU-old")])
    register(kubelet.directory)
    settle(kubelet, lambda state: state.messages == 1)
    newer = PluginServer(kubelet.directory, "gpu-b.sock")
    newer.start()
    try:
        newer.servicer.publish([device("GPU-new-0"), device("GPU-new-1")])
        register(kubelet.directory, endpoint="gpu-b.sock")
        assert plugin.servicer.wait_active_streams(0)
        settle(kubelet, lambda state: state.messages == 1 and "GPU-new-0" in state.devices)
        state = state_of(kubelet)
        assert state.endpoint == "gpu-b.sock" and state.connected and state.allocatable == 2
        assert newer.servicer.active_streams == 1
    finally:
        newer.stop()


# --------------------------------------------------------------------------- stream end and limits


def test_message_over_4_mib_breaks_the_stream(kubelet: KubeletEmulator, plugin: PluginServer) -> None:
    plugin.servicer.publish([device("GPU-0"), device("GPU-1")])
    register(kubelet.directory)
    settle(kubelet, lambda state: state.messages == 1)
    plugin.servicer.publish(devices_of_size(5 * 1024 * 1024))
    settle(kubelet, lambda state: not state.connected)
    state = state_of(kubelet)
    assert state.stream_error is not None
    assert "ResourceExhausted" in state.stream_error and "larger than max" in state.stream_error
    assert f"vs. {KUBELET_MAX_MESSAGE_BYTES}" in state.stream_error
    assert state.devices == {"GPU-0": UNHEALTHY, "GPU-1": UNHEALTHY}
    assert (state.capacity, state.allocatable, state.messages) == (2, 0, 1)


def test_message_of_exactly_4_mib_is_the_largest_accepted(
    kubelet: KubeletEmulator, plugin: PluginServer
) -> None:
    plugin.servicer.publish(devices_of_size(KUBELET_MAX_MESSAGE_BYTES))
    register(kubelet.directory)
    settle(kubelet, lambda state: state.messages == 1)
    state = state_of(kubelet)
    assert state.connected and state.last_message_bytes == KUBELET_MAX_MESSAGE_BYTES
    assert state.allocatable == state.capacity == KUBELET_MAX_MESSAGE_BYTES // 64

    plugin.servicer.publish(devices_of_size(KUBELET_MAX_MESSAGE_BYTES + 1))
    settle(kubelet, lambda state: not state.connected)
    assert "ResourceExhausted" in (state_of(kubelet).stream_error or "")


def test_plugin_stopping_marks_devices_unhealthy(kubelet: KubeletEmulator, plugin: PluginServer) -> None:
    plugin.servicer.publish([device("GPU-0"), device("GPU-1", UNHEALTHY)])
    register(kubelet.directory)
    settle(kubelet, lambda state: state.messages == 1)
    plugin.stop()
    settle(kubelet, lambda state: not state.connected)
    state = state_of(kubelet)
    assert state.devices == {"GPU-0": UNHEALTHY, "GPU-1": UNHEALTHY}
    assert (state.capacity, state.allocatable) == (2, 0)
    assert (state.stream_error or "").startswith("rpc error: code = ")


def test_plugin_ending_its_stream_is_eof(kubelet: KubeletEmulator, plugin: PluginServer) -> None:
    plugin.servicer.publish([device("GPU-0")])
    register(kubelet.directory)
    settle(kubelet, lambda state: state.messages == 1)
    plugin.servicer.finish()
    settle(kubelet, lambda state: not state.connected)
    state = state_of(kubelet)
    assert state.stream_error == "EOF" and (state.capacity, state.allocatable) == (1, 0)


# --------------------------------------------------------------------------- directory, restart, stop


def test_start_sweeps_stale_sockets_only(plugin_dir: Path) -> None:
    make_stale_socket(plugin_dir / "stale.sock")
    (plugin_dir / CHECKPOINT_NAME).write_text("{}")
    (plugin_dir / "subdir").mkdir()
    with KubeletEmulator(plugin_dir) as kubelet:
        assert sorted(path.name for path in plugin_dir.iterdir()) == [
            KUBELET_SOCKET_NAME,
            CHECKPOINT_NAME,
            "subdir",
        ]
        assert stat.S_ISSOCK(kubelet.socket_path.stat().st_mode)


def test_restart_deletes_sockets_and_plugin_must_reregister(
    kubelet: KubeletEmulator, plugin: PluginServer
) -> None:
    directory = kubelet.directory
    (directory / CHECKPOINT_NAME).write_text("{}")
    (directory / "notes.txt").write_text("not a socket")
    plugin.servicer.publish([device("GPU-0"), device("GPU-1")])
    register(directory)
    settle(kubelet, lambda state: state.messages == 1)
    old_inode = kubelet.socket_path.stat().st_ino
    before = time.monotonic()

    kubelet.restart()

    assert kubelet.restarts == 1
    assert (kubelet.socket_created_at or 0.0) > before
    assert kubelet.socket_path.stat().st_ino != old_inode
    assert sorted(path.name for path in directory.iterdir()) == [
        KUBELET_SOCKET_NAME,
        CHECKPOINT_NAME,
        "notes.txt",
    ]
    stopped = state_of(kubelet)
    assert not stopped.connected and (stopped.capacity, stopped.allocatable) == (2, 0)
    assert plugin.servicer.wait_active_streams(0)

    plugin.stop()  # its socket file is gone: serve again, then register again
    plugin.start()
    register(directory)
    settle(kubelet, lambda state: state.messages == 1 and state.allocatable == 2)
    assert plugin.servicer.streams == 2 and state_of(kubelet).connected
    assert [record.ok for record in kubelet.registrations] == [True, True]


def _new_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread not in before and thread.is_alive()]


def test_stop_leaves_no_socket_and_no_threads(plugin_dir: Path) -> None:
    before = set(threading.enumerate())
    kubelet = KubeletEmulator(plugin_dir)
    kubelet.start()
    plugin = PluginServer(plugin_dir)
    plugin.start()
    plugin.servicer.publish([device("GPU-0")])
    register(plugin_dir)
    settle(kubelet, lambda state: state.messages == 1)

    kubelet.stop()
    kubelet.stop()
    assert not kubelet.socket_path.exists()
    assert not state_of(kubelet).connected
    assert not [thread.name for thread in _new_threads(before) if thread.name.startswith("kubelet")]
    assert plugin.servicer.wait_active_streams(0)
    plugin.stop()
    assert _new_threads(before) == []


def test_wait_for_times_out(kubelet: KubeletEmulator) -> None:
    assert not kubelet.wait_for(lambda emulator: False, 0.05)


def test_listener_sees_each_change_in_order(plugin_dir: Path) -> None:
    events: list[KubeletEvent] = []
    with KubeletEmulator(plugin_dir, listener=events.append) as kubelet:
        plugin = PluginServer(plugin_dir)
        plugin.start()
        plugin.servicer.publish([device("GPU-0"), device("GPU-1", UNHEALTHY)])
        register(plugin_dir)
        settle(kubelet, lambda state: state.messages == 1)
        plugin.stop()
        settle(kubelet, lambda state: not state.connected)
    assert [event.kind for event in events] == ["serving", "registered", "devices", "disconnected", "stopped"]
    assert str(events[1]) == f"registered resource={RESOURCE} endpoint={ENDPOINT}"
    assert str(events[2]) == f"devices resource={RESOURCE} healthy=1/2"
    assert str(events[3]).startswith(f"disconnected resource={RESOURCE} healthy=0/2 error=")


# --------------------------------------------------------------------------- foreground runner


def _read_lines(stream: Any, lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))


def _next_line_starting(lines: queue.Queue[str], prefix: str) -> str:
    deadline = time.monotonic() + WAIT_S
    try:
        while (left := deadline - time.monotonic()) > 0:
            line = lines.get(timeout=left)
            if line.startswith(prefix):
                return line
    except queue.Empty:
        pass
    raise AssertionError(f"no line starting {prefix!r} within {WAIT_S} s")


def test_runner_prints_events_and_exits_zero_on_sigterm(plugin_dir: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from kubesim.kubelet import run_kubelet; "
        "sys.exit(run_kubelet(Path(sys.argv[1])))"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(plugin_dir)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(process.stdout, lines))
    reader.start()
    plugin = PluginServer(plugin_dir)
    try:
        assert _next_line_starting(lines, "serving ") == f"serving path={plugin_dir / KUBELET_SOCKET_NAME}"
        plugin.start()
        plugin.servicer.publish([device("GPU-0")])
        register(plugin_dir)
        assert (
            _next_line_starting(lines, "registered ") == f"registered resource={RESOURCE} endpoint={ENDPOINT}"
        )
        assert _next_line_starting(lines, "devices ") == f"devices resource={RESOURCE} healthy=1/1"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=WAIT_S) == 0
        assert _next_line_starting(lines, "stopped") == "stopped"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join()
        plugin.stop()
    assert not (plugin_dir / KUBELET_SOCKET_NAME).exists()
