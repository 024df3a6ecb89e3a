"""A client that drops its connection mid-request (kubectl interrupted, a watch cut by a proxy)
costs the API emulator nothing and prints nothing: `simulate` shares its stderr with the user."""

from __future__ import annotations

import socket
import struct

import pytest

from tests.kube.waiting import wait_for
from tests.sim.apiserver_helpers import running_emulator


def test_a_connection_reset_mid_request_prints_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    with running_emulator() as emulator:
        for _ in range(3):
            client = socket.create_connection(("127.0.0.1", emulator.port))
            client.sendall(b"GET /api/v1/namespaces HTTP/1.1\r\nHost: x\r\n")  # headers not ended
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # linger 0: the server reads a reset, not an end of file
        assert wait_for(lambda: emulator.dropped_connections == 3)
        with socket.create_connection(("127.0.0.1", emulator.port)) as client:  # still serving
            client.sendall(b"GET /api/v1/namespaces HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert client.recv(64).startswith(b"HTTP/1.1 200")
    assert "Traceback" not in capsys.readouterr().err  # stop() joined every handler: all printed
