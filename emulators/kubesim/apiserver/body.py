"""A request's body off the wire: framed by Content-Length or by the chunked transfer coding (kubectl's
`create --raw -f` streams its file chunked), and at most 3 MiB, the real server's limit for JSON."""

from __future__ import annotations

from email.message import Message
from io import BufferedIOBase

from kubesim.apiserver.errors import ApiError

#: kube-apiserver's `MaxRequestBodyBytes`.
MAX_BODY_BYTES = 3 * 1024 * 1024
#: Longest chunk-size or trailer line read (Go's net/http allows 4 KiB).
_MAX_LINE_BYTES = 4096
_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")


def read_body(headers: Message, stream: BufferedIOBase, limit: int = MAX_BODY_BYTES) -> bytes:
    """The whole body. An ApiError leaves the stream mid-body: the connection must close after it."""
    coding = headers.get("Transfer-Encoding")
    if coding is not None:
        if coding.strip().lower() != "chunked":
            raise ApiError(501, "", f'unsupported Transfer-Encoding "{coding}"')
        return _read_chunked(stream, limit)
    length_text = headers.get("Content-Length")
    if not length_text:
        return b""
    if not length_text.strip().isdigit():
        raise _unreadable(f'invalid Content-Length "{length_text}"')
    length = int(length_text)
    if length > limit:
        raise _too_large(limit)
    body = stream.read(length)
    if len(body) < length:
        raise _unreadable("unexpected end of body")
    return body


def _read_chunked(stream: BufferedIOBase, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size = _chunk_size(_line(stream))
        if size == 0:
            break
        total += size
        if total > limit:
            raise _too_large(limit)
        data = stream.read(size)
        if len(data) < size:
            raise _unreadable("unexpected end of body")
        if stream.read(2) != b"\r\n":
            raise _unreadable("chunk data not followed by CRLF")
        parts.append(data)
    while _line(stream):  # trailer fields, up to the blank line that ends the message
        pass
    return b"".join(parts)


def _line(stream: BufferedIOBase) -> bytes:
    line = stream.readline(_MAX_LINE_BYTES + 1)
    if not line.endswith(b"\n"):
        raise _unreadable("chunk line too long" if len(line) > _MAX_LINE_BYTES else "unexpected end of body")
    return line.rstrip(b"\r\n")


def _chunk_size(line: bytes) -> int:
    digits = line.split(b";", 1)[0].strip()  # chunk extensions are ignored
    if not digits or len(digits) > 16 or not set(digits) <= _HEX_DIGITS:
        raise _unreadable(f'invalid chunk size "{digits.decode(errors="replace")}"')
    return int(digits, 16)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "RequestEntityTooLarge", f"Request entity too large: limit is {limit}")


def _unreadable(why: str) -> ApiError:
    return ApiError(400, "BadRequest", f"error reading request body: {why}")
