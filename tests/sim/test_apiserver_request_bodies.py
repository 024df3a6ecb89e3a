"""Request bodies as clients frame them on the wire: Content-Length, or chunked (kubectl's `--raw -f`
streams its file that way), bounded at the real server's 3 MiB. Bytes go over a plain socket so the
framing is exactly what the test writes."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator

import pytest

from kubesim.apiserver import ApiServerEmulator
from tests.sim.apiserver_helpers import Obj, running_emulator

COLLECTION = "/api/v1/namespaces/default/configmaps"
LIMIT = 3 * 1024 * 1024
TOO_LARGE = f"Request entity too large: limit is {LIMIT}"


@pytest.fixture
def emulator() -> Iterator[ApiServerEmulator]:
    with running_emulator() as emulator:
        yield emulator


def configmap(name: str, **data: str) -> bytes:
    return json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}
    ).encode()


def chunked(*parts: bytes, extension: bytes = b"", trailer: bytes = b"") -> bytes:
    framed = b"".join(b"%x%s\r\n%s\r\n" % (len(part), extension, part) for part in parts)
    return framed + b"0\r\n" + trailer + b"\r\n"


class Connection:
    """One keep-alive connection: requests written byte for byte, answers parsed by http.client."""

    def __init__(self, emulator: ApiServerEmulator) -> None:
        self.socket = socket.create_connection(("127.0.0.1", emulator.port), timeout=10)

    def exchange(self, head: str, body: bytes = b"") -> tuple[int, Obj, dict[str, str]]:
        request = head.replace("\n", "\r\n") + "\r\n"  # the blank line ending the headers
        self.socket.sendall(request.encode() + body)
        response = http.client.HTTPResponse(self.socket)
        response.begin()
        answer = json.loads(response.read())
        return response.status, answer, {name.lower(): value for name, value in response.getheaders()}

    def closed_by_server(self) -> bool:
        return self.socket.recv(1) == b""

    def close(self) -> None:
        self.socket.close()


@pytest.fixture
def connection(emulator: ApiServerEmulator) -> Iterator[Connection]:
    opened = Connection(emulator)
    yield opened
    opened.close()


def post(framing: str) -> str:
    """The request line and headers of a create, `framing` being the body's framing header."""
    return f"POST {COLLECTION} HTTP/1.1\nHost: emulator\nContent-Type: application/json\n{framing}\n"


def test_a_chunked_body_is_decoded_and_the_connection_serves_the_next_request(
    connection: Connection, emulator: ApiServerEmulator
) -> None:
    body = configmap("cfg", a="1")
    parts = (body[:7], body[7:30], body[30:])  # a chunk boundary inside a JSON string, too
    code, created, _ = connection.exchange(
        post("Transfer-Encoding: chunked"), chunked(*parts, extension=b";note=x", trailer=b"X-Sum: 1\r\n")
    )
    assert code == 201 and (created["metadata"]["name"], created["data"]) == ("cfg", {"a": "1"})
    code, second, _ = connection.exchange(
        post("Transfer-Encoding: chunked"), chunked(configmap("two", b="2"))
    )
    assert code == 201 and second["metadata"]["name"] == "two"
    assert [cm["metadata"]["name"] for cm in emulator.list("configmaps", "default")] == ["cfg", "two"]


def test_a_content_length_body_still_works(connection: Connection) -> None:
    body = configmap("cfg", a="1")
    code, created, _ = connection.exchange(post(f"Content-Length: {len(body)}"), body)
    assert code == 201 and created["data"] == {"a": "1"}


@pytest.mark.parametrize(
    ("head", "body"),
    [
        pytest.param(post(f"Content-Length: {LIMIT + 1}"), b"", id="content-length"),
        pytest.param(post("Transfer-Encoding: chunked"), b"%x\r\n" % (LIMIT + 1), id="one-chunk"),
    ],
)
def test_a_body_over_three_mib_is_refused_before_it_is_read(
    connection: Connection, emulator: ApiServerEmulator, head: str, body: bytes
) -> None:
    code, status, headers = connection.exchange(head, body)
    assert (code, status["reason"], status["message"]) == (413, "RequestEntityTooLarge", TOO_LARGE)
    assert headers["connection"] == "close" and connection.closed_by_server()  # the body is still unread
    assert emulator.list("configmaps", "default") == []


def test_chunks_adding_up_to_more_than_three_mib_are_refused(connection: Connection) -> None:
    chunk = b"%x\r\n%s\r\n" % (LIMIT // 2, b" " * (LIMIT // 2))
    code, status, _ = connection.exchange(post("Transfer-Encoding: chunked"), chunk * 2 + b"1\r\n")
    assert (code, status["message"]) == (413, TOO_LARGE)


@pytest.mark.parametrize(
    ("head", "body", "message"),
    [
        (post("Transfer-Encoding: chunked"), b"zz\r\n{}\r\n0\r\n\r\n", 'invalid chunk size "zz"'),
        (post("Transfer-Encoding: chunked"), b"2\r\n{}XX0\r\n\r\n", "chunk data not followed by CRLF"),
        (post("Content-Length: ten"), b"", 'invalid Content-Length "ten"'),
    ],
    ids=["size", "crlf", "length"],
)
def test_a_malformed_body_frame_is_a_bad_request_naming_the_problem(
    connection: Connection, head: str, body: bytes, message: str
) -> None:
    code, status, headers = connection.exchange(head, body)
    assert (code, status["reason"]) == (400, "BadRequest")
    assert status["message"] == f"error reading request body: {message}"
    assert headers["connection"] == "close"


def test_a_transfer_coding_other_than_chunked_is_not_implemented(connection: Connection) -> None:
    code, status, headers = connection.exchange(post("Transfer-Encoding: gzip, chunked"), chunked(b"{}"))
    assert code == 501 and status["message"] == 'unsupported Transfer-Encoding "gzip, chunked"'
    assert headers["connection"] == "close"
