"""The floor of the daemon's start-up and registration benchmarks: the least a Python device plugin
does before kubelet knows it. Imports grpc and the generated device-plugin stubs, serves the
DevicePlugin service (kubelet dials back for GetDevicePluginOptions before Register answers) on a
Unix socket and calls Register once, then waits for SIGTERM.
Run: `.venv/bin/python bench/floor_plugin.py DEVICE_PLUGIN_DIR` (bench/startup.py does); bench/daemon.py
uses `serve` and `register` in its own process.
"""

import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc

from deviceplugin.api import deviceplugin_grpc
from deviceplugin.api import deviceplugin_pb2 as pb

ENDPOINT = "floor.sock"


class Plugin(deviceplugin_grpc.DevicePluginServicer):
    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions()


def serve(directory: Path) -> grpc.Server:
    """The DevicePlugin service on `directory`/floor.sock."""
    server = grpc.server(futures.ThreadPoolExecutor(4))
    deviceplugin_grpc.add_DevicePluginServicer_to_server(Plugin(), server)
    server.add_insecure_port(f"unix://{directory}/{ENDPOINT}")
    server.start()
    return server


def register(directory: Path) -> None:
    """One Register with the kubelet listening in `directory`, over a new channel."""
    request = pb.RegisterRequest(version="v1beta1", endpoint=ENDPOINT, resource_name="example.com/floor")
    with grpc.insecure_channel(f"unix://{directory}/kubelet.sock") as channel:
        deviceplugin_grpc.RegistrationStub(channel).Register(request, timeout=10)


def main() -> None:
    directory = Path(sys.argv[1])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    server = serve(directory)
    register(directory)
    stop.wait()
    server.stop(None)


if __name__ == "__main__":
    main()
