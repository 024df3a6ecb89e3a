"""How the facade reads the answers an API server (or a proxy in front of one) may give, over a real
socket: chunked bodies, a connection the server closes after its answer or while it is idle, a body
that runs to the close, a cut answer, TLS verified as the client configures it; and a facade with
no client yet. A raw server answers each
request with the next canned bytes and counts the connections it accepted."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import kubernetes
import pytest
import urllib3

from deviceplugin.kube import wire
from deviceplugin.kube.api import ApiError, Kube
from tests.kube.waiting import wait_for


class CannedServer:
    """Answers each request (read up to its blank line; the tests send no body) with the next of
    `answers`; an answer ending in CLOSE closes the connection after it is written, and SILENT
    answers nothing, holding the connection open until the server is closed."""

    CLOSE = b"<close>"
    SILENT = b"<silent>"

    def __init__(self, answers: list[bytes], tls: ssl.SSLContext | None = None) -> None:
        self.answers = list(answers)
        self._tls = tls
        self.connections = 0
        self.closed = 0  # connections the server closed
        self.requests: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._closing = threading.Event()
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
                    try:
                        chunk = conn.recv(65536)
                    except OSError:  # reset by a client that left part of an answer unread
                        return
                    if not chunk:
                        return
                    buffer += chunk
                request, buffer = buffer.split(b"\r\n\r\n", 1)
                with self._lock:
                    self.requests.append(request)
                    answer = self.answers.pop(0)
                if answer == self.SILENT:
                    self._closing.wait()
                    return
                closing = answer.endswith(self.CLOSE)
                try:
                    conn.sendall(answer.removesuffix(self.CLOSE))
                except OSError:  # a client that gave up on the answer part way
                    return
                if closing:
                    conn.shutdown(socket.SHUT_WR)
                    with self._lock:
                        self.closed += 1
                    return

    def close(self) -> None:
        self._closing.set()
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
        b'5;ext=1;name="v"\r\n{"kin\r\n'  # chunk extensions are skipped
        b'10\r\nd": "Node", "a":\r\n'  # sizes are hexadecimal
        b'7\r\n "b"\r\n}\r\n'  # a CRLF inside a chunk is data
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
    assert "closed before the whole answer" in str(caught.value)  # what the daemon logs
    assert kube.errors == {("patch_node", 0): 1}
    assert kube.get_node("n") == {}  # on a new connection
    assert server.connections == 2


def _outcome(call: Callable[[], object]) -> object:
    """What `call` returned or raised, failing the test when it has not ended within the waiting
    tests' deadline (a call that hangs is a failure, not a stuck test run)."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as err:  # the outcome under test
            outcome.append(err)

    threading.Thread(target=run, daemon=True).start()
    assert wait_for(lambda: bool(outcome)), "the call did not end"
    return outcome[0]


def test_a_server_that_never_answers_fails_the_call_within_the_read_timeout(
    canned: list[CannedServer],
) -> None:
    server, kube = _serve(canned, CannedServer.SILENT, _fixed(b'{"n": 2}'))
    kube.timeout = urllib3.Timeout(connect=3.0, read=0.2)
    failed = _outcome(lambda: kube.get_node("n"))
    assert isinstance(failed, ApiError) and failed.status == 0 and failed.transient
    assert kube.errors == {("read_node", 0): 1}
    assert kube.get_node("n") == {"n": 2}  # a fresh connection: the silent one is not reused
    assert server.connections == 2


@pytest.mark.parametrize("status_line", [b"ICY 200 OK", b"HTTP/1.1 OK", b"SSH-2.0-OpenSSH_9.6"])
def test_a_non_http_answer_is_transient_and_its_connection_dropped(
    canned: list[CannedServer], status_line: bytes
) -> None:
    server, kube = _serve(canned, status_line + b"\r\nContent-Length: 2\r\n\r\n{}", _fixed(b'{"n": 2}'))
    with pytest.raises(ApiError) as caught:
        kube.get_node("n")
    assert caught.value.status == 0 and caught.value.transient
    assert "not an HTTP answer" in str(caught.value)
    assert kube.errors == {("read_node", 0): 1}
    assert kube.get_node("n") == {"n": 2}
    assert server.connections == 2  # the server kept the first open; the client dropped it


def test_a_server_that_never_accepts_fails_the_call_within_the_connect_timeout() -> None:
    """A listener whose accept queue is full: the kernel drops the client's SYN, so its connect
    would wait for the SYN retries (minutes) without a connect timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = [socket.socket() for _ in range(4)]
    for filler in queued:
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    configuration.retries = False
    kube = Kube(kubernetes.client.ApiClient(configuration))
    kube.timeout = urllib3.Timeout(connect=0.2, read=10.0)
    try:
        failed = _outcome(lambda: kube.get_node("n"))
    finally:
        for sock in [*queued, listener]:
            sock.close()
    assert isinstance(failed, ApiError) and failed.status == 0 and failed.transient
    assert kube.errors == {("read_node", 0): 1}


@pytest.mark.parametrize(
    ("answer", "told"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2x\r\n\r\n{}", "a bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}xx", "does not end with CRLF"),
    ],
    ids=["content-length", "chunk end"],
)
def test_a_malformed_answer_is_transient_and_says_what_was_wrong(
    canned: list[CannedServer], answer: bytes, told: str
) -> None:
    server, kube = _serve(canned, answer, _fixed(b'{"n": 2}'))
    with pytest.raises(ApiError) as caught:
        kube.get_node("n")
    assert caught.value.status == 0 and caught.value.transient
    assert told in str(caught.value)  # what the daemon logs
    assert kube.get_node("n") == {"n": 2}
    assert server.connections == 2


_HEAD = b"HTTP/1.1 200 OK\r\n"
_LONG = b"x" * (wire.MAX_HEAD + 1024)


@pytest.mark.parametrize(
    "answer",
    [
        _HEAD + b"X-Long: " + _LONG,
        _HEAD + b"Transfer-Encoding: chunked\r\n\r\n5;ext=" + _LONG,
        _HEAD + b"Transfer-Encoding: chunked\r\n\r\n0\r\nX-Trailer: " + _LONG,
    ],
    ids=["header", "chunk-size line", "trailer"],
)
def test_a_line_too_long_fails_the_call_without_waiting_for_the_rest(
    canned: list[CannedServer], answer: bytes
) -> None:
    """The server sends the too-long line, no end to it, and keeps the connection open."""
    _, kube = _serve(canned, answer)
    with pytest.raises(ApiError) as caught:
        kube.get_node("n")
    assert caught.value.status == 0 and caught.value.transient
    assert "too long" in str(caught.value)


def test_fields_are_read_without_the_optional_space_and_among_others(canned: list[CannedServer]) -> None:
    server, kube = _serve(
        canned,
        b'HTTP/1.1 200 OK\r\nContent-Length:10\r\nX-A: 1\r\nX-B: 2\r\n\r\n{"n": "1"}',
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding:chunked\r\nX-A: 1\r\nX-B: 2\r\n\r\n8\r\n{"n": 2}\r\n0\r\n\r\n',
    )
    assert [kube.get_node("n"), kube.get_node("n")] == [{"n": "1"}, {"n": 2}]
    assert server.connections == 1


def test_a_body_to_the_close_longer_than_one_read_is_read_whole(canned: list[CannedServer]) -> None:
    items = [{"name": f"node-{i:06d}"} for i in range(3 * wire.READ_SIZE // 16)]
    body = json.dumps({"items": items}).encode()
    _, kube = _serve(canned, b"HTTP/1.0 200 OK\r\n\r\n" + body + CannedServer.CLOSE)
    assert _outcome(kube.list_nodes) == items


def test_answers_without_a_body_leave_the_connection_ready_for_the_next(canned: list[CannedServer]) -> None:
    """A 204 has no body whatever its headers say, and neither has the answer to a HEAD; reading
    one would take the next answer's bytes, or wait for bytes that never come."""
    server = CannedServer(
        [
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
            _fixed(b"{}"),
        ]
    )
    canned.append(server)
    pool = urllib3.HTTPConnectionPool("127.0.0.1", server.port, maxsize=1)
    timeout = urllib3.Timeout(connect=3.0, read=10.0)
    host = f"Host: 127.0.0.1:{server.port}\r\n\r\n".encode()
    answers = [
        wire.exchange(pool, method, f"{method} / HTTP/1.1\r\n".encode() + host, timeout)
        for method in ("PATCH", "HEAD", "GET")
    ]
    assert answers == [
        wire.Answer(204, "No Content", b""),
        wire.Answer(200, "OK", b""),
        wire.Answer(200, "OK", b"{}"),
    ]
    assert server.connections == 1


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
