"""How the facade reads the answers an API server (or a proxy in front of one) may give, over a real
socket: chunked bodies, a connection the server closes after its answer or while it is idle, a body
that runs to the close, a cut answer, TLS verified as the client configures it; and a facade with
no client yet. A raw server answers each
request with the next canned bytes and counts the connections it accepted."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from deviceplugin.kube.api import ApiError, Kube
from tests.kube.waiting import wait_for


class CannedServer:
    """Answers each request (read up to its blank line; the tests send no body) with the next of
    `answers`; an answer ending in CLOSE closes the connection after it is written."""

    CLOSE = b"<close>"

    def __init__(self, answers: list[bytes], tls: ssl.SSLContext | None = None) -> None:
        self.answers = list(answers)
        self._tls = tls
        self.connections = 0
        self.closed = 0  # connections the server closed
        self.requests: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        if self._tls is not None:
            try:
                conn = self._tls.wrap_socket(conn, server_side=True)
            except OSError:  # a client that does not trust the certificate
                conn.close()
                return
        with conn:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                request, buffer = buffer.split(b"\r\n\r\n", 1)
                with self._lock:
                    self.requests.append(request)
                    answer = self.answers.pop(0)
                closing = answer.endswith(self.CLOSE)
                conn.sendall(answer.removesuffix(self.CLOSE))
                if closing:
                    conn.shutdown(socket.SHUT_WR)
                    with self._lock:
                        self.closed += 1
                    return

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def canned() -> Iterator[list[CannedServer]]:
    servers: list[CannedServer] = []
    yield servers
    for server in servers:
        server.close()


def _kube(server: CannedServer) -> Kube:
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.port}"
    configuration.retries = False
    return Kube(kubernetes.client.ApiClient(configuration))


def _serve(canned: list[CannedServer], *answers: bytes) -> tuple[CannedServer, Kube]:
    server = CannedServer(list(answers))
    canned.append(server)
    return server, _kube(server)


def _fixed(body: bytes, *headers: str) -> bytes:
    head = "".join(f"{header}\r\n" for header in headers)
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body


def test_chunked_answers_are_joined_and_the_connection_kept(canned: list[CannedServer]) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'5;ext=1\r\n{"kin\r\n'
        b'c\r\nd": "Node", \r\n'
        b'b\r\n"a": "b"\r\n}\r\n'  # a CRLF inside a chunk is data
        b"0\r\nX-Trailer: t\r\n\r\n"
    )
    server, kube = _serve(canned, chunked, _fixed(b'{"kind": "Pod"}'))
    assert kube.get_node("n") == {"kind": "Node", "a": "b"}
    assert kube.get_pod("ns", "p") == {"kind": "Pod"}
    assert server.connections == 1


def test_an_interim_answer_is_skipped(canned: list[CannedServer]) -> None:
    _, kube = _serve(canned, b"HTTP/1.1 100 Continue\r\n\r\n" + _fixed(b'{"kind": "Node"}'))
    assert kube.get_node("n") == {"kind": "Node"}


def test_a_connection_closed_after_an_answer_or_while_idle_is_not_reused(
    canned: list[CannedServer],
) -> None:
    server, kube = _serve(
        canned,
        _fixed(b'{"n": 1}', "Connection: close"),
        _fixed(b'{"n": 2}') + CannedServer.CLOSE,  # kept alive, then closed by the server while idle
        b'HTTP/1.0 200 OK\r\n\r\n{"n": 3}' + CannedServer.CLOSE,  # no length: the body runs to the close
        _fixed(b'{"n": 4}'),
    )
    assert [kube.get_node("n"), kube.get_node("n")] == [{"n": 1}, {"n": 2}]
    assert wait_for(lambda: server.closed == 1)  # the close has been sent before the next request
    assert [kube.get_node("n"), kube.get_node("n")] == [{"n": 3}, {"n": 4}]
    assert server.connections == 4
    assert not kube.errors


def test_a_cut_answer_is_transient_and_counted(canned: list[CannedServer]) -> None:
    server, kube = _serve(
        canned,
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{" + CannedServer.CLOSE,
        _fixed(b"{}"),
    )
    with pytest.raises(ApiError) as caught:
        kube.patch_node("n", {"metadata": {"labels": {"a": "1"}}})
    assert caught.value.status == 0 and caught.value.transient
    assert kube.errors == {("patch_node", 0): 1}
    assert kube.get_node("n") == {}  # on a new connection
    assert server.connections == 2


def test_a_request_line_carries_the_api_root_below_the_host(canned: list[CannedServer]) -> None:
    server, _ = _serve(canned, _fixed(b"{}"))
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.port}/k8s/clusters/c-1"
    kube = Kube(kubernetes.client.ApiClient(configuration))
    kube.patch_pod_annotations("ml", "p", {"a": "1"})
    request_line, host = server.requests[0].split(b"\r\n")[:2]
    assert request_line == b"PATCH /k8s/clusters/c-1/api/v1/namespaces/ml/pods/p HTTP/1.1"
    assert host == f"Host: 127.0.0.1:{server.port}".encode()


def test_a_facade_without_a_client_fails_every_call_as_unanswered_and_counts_it() -> None:
    kube = Kube(None)
    with pytest.raises(ApiError) as patched:
        kube.patch_pod_annotations("ml", "p", {"a": "1"})
    with pytest.raises(ApiError) as watched:
        kube.watch_pods("", "1", 5)
    assert patched.value.status == watched.value.status == 0
    assert patched.value.transient and watched.value.transient
    assert kube.errors == {("patch_namespaced_pod", 0): 1, ("watch_pods", 0): 1}


def test_requests_go_over_tls_as_the_client_configures_it(canned: list[CannedServer], tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl makes the server's certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    self_signed = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=api"]
    subprocess.run(
        [
            "openssl",
            *self_signed,
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = CannedServer([_fixed(b'{"n": 1}'), _fixed(b'{"n": 2}')], tls)
    canned.append(server)

    def client(ca: Path | None) -> Kube:
        configuration = kubernetes.client.Configuration()
        configuration.host = f"https://127.0.0.1:{server.port}"
        configuration.ssl_ca_cert = None if ca is None else str(ca)
        return Kube(kubernetes.client.ApiClient(configuration))

    with pytest.raises(ApiError) as untrusted:
        client(None).get_node("n")  # the system's CAs do not know the server
    assert untrusted.value.status == 0
    trusting = client(cert)
    assert [trusting.get_node("n"), trusting.get_node("n")] == [{"n": 1}, {"n": 2}]
    assert server.connections == 2  # the refused one, then one kept alive
