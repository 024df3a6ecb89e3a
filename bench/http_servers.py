"""The HTTP server under the extender and the daemon's /metrics: speed and behaviour under abuse.

Compares, each in a process of its own with the same handler (parse the JSON body, answer a JSON
reply of the same size, as filter does) and comparable limits (4 worker threads, 256 connections,
5 s request time, 8 MiB body where the server has such a setting):
- `stdlib`: `http.server.ThreadingHTTPServer` as the extender and the daemon used it until
  issue 13 (one thread per connection, 120 s idle time-out, bodies up to 256 MiB);
- `bounded`: `deviceplugin.httpserver` (asyncio connections, a fixed worker pool);
- `waitress` and `uvicorn` (with httptools) when installed (`pip install waitress uvicorn
  httptools`): the candidate production servers.
Floor: the same JSON work in-process without HTTP, in the same run; ratios are to the floor.
Abuse: 1,000 half-open connections (threads and RSS of the server process, and whether a normal
request is answered while they are open), one 200 MB POST (the server's peak RSS), one client that
trickles its headers a byte every 100 ms (is it cut off within 15 s?).
Rows (`report.record`) for the product's server, `bounded`: filter-shaped POST p50 <= 3x the floor
(the ratio issue 15 allows the extender over the same JSON work); GET p50 <= 1 ms (replies go out
in one write with TCP_NODELAY: none waits ~40 ms for a delayed ACK); a request answered while
1,000 half-open connections are held, with a bounded thread count.
Run: `.venv/bin/python bench/http_servers.py` (`--requests N`).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import importlib
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from report import Row, record

MiB = 1 << 20
WORKERS, CONNECTIONS, TIMEOUT_S, MAX_BODY = 4, 256, 5, 8 * MiB
SIZES = (5000, 20000)
HALF_OPEN = 1000
BIG_POST = 200 * 1000 * 1000
SERVERS = ("stdlib", "bounded", "waitress", "uvicorn")
PRODUCT = "bounded"
FLOOR_RATIO = 3.0
GET_BAR_US = 1000.0
MAX_THREADS = 16  # the loop thread, the worker pool and a few of the interpreter's


def node_names(count: int) -> list[str]:
    return [f"gpu-node-{n:05d}.prod-cluster.example.internal" for n in range(count)]


def filter_body(count: int) -> bytes:
    pod = {"metadata": {"name": "new", "namespace": "bench", "uid": "u1"}, "spec": {"containers": []}}
    return json.dumps({"Pod": pod, "NodeNames": node_names(count)}).encode()


def respond(path: str, body: bytes) -> tuple[int, bytes]:
    """The handler every server runs: filter-shaped JSON in and out, /healthz, 404."""
    if path.endswith("/filter"):
        try:
            names = json.loads(body).get("NodeNames", [])
        except (ValueError, AttributeError):
            return 400, b'{"Error": "bad body"}'
        return 200, json.dumps({"NodeNames": names, "FailedNodes": {}, "Error": ""}).encode()
    if path.endswith("/healthz"):
        return 200, b'"ok"'
    return 404, b'{"Error": "no such endpoint"}'


# ---------------------------------------------------------------------------- the servers


def serve_stdlib(sock: socket.socket) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: PLC0415

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 120.0

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > 256 * MiB:
                self.send_error(400)
                return
            status, data = respond(self.path, self.rfile.read(length))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def server_bind(self) -> None:  # the socket is bound already
            self.server_address = sock.getsockname()

        def server_activate(self) -> None:
            pass

    server = Server(sock.getsockname(), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.serve_forever()


def serve_bounded(sock: socket.socket) -> None:
    from deviceplugin.httpserver import HttpServer, Limits, Request, Response  # noqa: PLC0415

    def handle(request: Request) -> Response:
        status, data = respond(request.path, request.body)
        return Response(status, data, "application/json")

    limits = Limits(
        max_body_bytes=MAX_BODY, max_connections=CONNECTIONS, workers=WORKERS, request_timeout_s=TIMEOUT_S
    )
    host, port = sock.getsockname()[:2]
    sock.close()  # HttpServer binds its own; SO_REUSEADDR lets it take the same port
    server = HttpServer((host, port), handle, limits)
    server.start()
    while True:
        time.sleep(3600)


def serve_waitress(sock: socket.socket) -> None:
    waitress: Any = importlib.import_module("waitress")  # optional, not a project dependency

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        status, data = respond(environ["PATH_INFO"], body)
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        start_response(f"{status} X", headers)
        return [data]

    waitress.serve(
        app,
        sockets=[sock],
        threads=WORKERS,
        connection_limit=CONNECTIONS,
        channel_timeout=TIMEOUT_S,
        cleanup_interval=1,
        max_request_body_size=MAX_BODY,
        _quiet=True,
    )


def serve_uvicorn(sock: socket.socket) -> None:
    uvicorn: Any = importlib.import_module("uvicorn")  # optional, not a project dependency

    pool = ThreadPoolExecutor(WORKERS)

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        loop = asyncio.get_running_loop()
        status, data = await loop.run_in_executor(pool, respond, scope["path"], b"".join(chunks))
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    config = uvicorn.Config(
        app, http="httptools", limit_concurrency=CONNECTIONS, timeout_keep_alive=TIMEOUT_S, log_level="error"
    )
    uvicorn.Server(config).run(sockets=[sock])


def available(name: str) -> bool:
    needs = {"stdlib": (), "bounded": (), "waitress": ("waitress",), "uvicorn": ("uvicorn", "httptools")}
    try:
        for module in needs[name]:
            importlib.import_module(module)
    except ImportError:
        return False
    return True


@contextmanager
def server_process(name: str) -> Iterator[tuple[int, int]]:
    """(pid, port) of `bench/http_servers.py --serve NAME`, stopped at the end."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # the servers' own reports of the abuse below
        text=True,
        env=os.environ,
    )
    assert process.stdout is not None
    port = int(process.stdout.readline())
    try:
        wait_answering(port)
        yield process.pid, port
    finally:
        process.kill()
        process.wait()


def wait_answering(port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            get(port, "/healthz", timeout=5)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def run_server(name: str) -> None:
    sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
    print(sock.getsockname()[1], flush=True)
    {"stdlib": serve_stdlib, "bounded": serve_bounded, "waitress": serve_waitress, "uvicorn": serve_uvicorn}[
        name
    ](sock)


# ---------------------------------------------------------------------------- measurements


def get(port: int, path: str, timeout: float = 10) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def proc_status(pid: int) -> dict[str, int]:
    """Threads, VmRSS and VmHWM (peak RSS) in KiB, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Threads", "VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def floor_ms(body: bytes, requests: int) -> list[float]:
    samples = []
    for _ in range(requests):
        start = time.perf_counter()
        respond("/filter", body)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def post_ms(port: int, body: bytes, requests: int) -> list[float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    samples = []
    try:
        for _ in range(requests + 2):
            start = time.perf_counter()
            connection.request("POST", "/filter", body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            assert response.status == 200, response.status
            samples.append((time.perf_counter() - start) * 1000)
    finally:
        connection.close()
    return samples[2:]  # warm-up


def small_get_us(port: int, requests: int) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    samples = []
    try:
        for _ in range(requests):
            start = time.perf_counter()
            connection.request("GET", "/healthz")
            connection.getresponse().read()
            samples.append((time.perf_counter() - start) * 1e6)
    finally:
        connection.close()
    return statistics.median(samples)


def concurrent_rps(port: int, clients: int, each: int) -> float:
    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(each):
            connection.request("POST", "/bind", body=b'{"PodName": "p"}')
            connection.getresponse().read()
        connection.close()

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    return clients * each / (time.perf_counter() - start)


def half_open(pid: int, port: int) -> tuple[int, float, str]:
    """Server threads and RSS growth (MiB) with 1,000 half-open connections, and how long a normal
    request waits meanwhile ('-' when not answered in 10 s)."""
    before = proc_status(pid)
    sockets = []
    for n in range(HALF_OPEN):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        if n % 2:
            sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")  # never ends
        sockets.append(sock)
    try:
        start = time.perf_counter()
        try:
            get(port, "/healthz", timeout=10)
            answered = f"{(time.perf_counter() - start) * 1000:.0f} ms"
        except OSError:
            answered = "-"
        after = proc_status(pid)
    finally:
        for sock in sockets:
            sock.close()
    return after["Threads"], (after["VmRSS"] - before["VmRSS"]) / 1024, answered


def big_post(pid: int, port: int) -> tuple[str, float]:
    """Status of a 200 MB POST and the server's peak RSS (MiB) after it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {BIG_POST}\r\n\r\n".encode())
    chunk = b" " * MiB
    sent, status = 0, "none"
    try:
        while sent < BIG_POST - 2:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break  # answered before the body was sent
            sock.sendall(chunk[: min(len(chunk), BIG_POST - 2 - sent)])
            sent += min(len(chunk), BIG_POST - 2 - sent)
        else:
            sock.sendall(b"{}")
        reply = sock.recv(200)
        status = reply.split(b" ", 2)[1].decode() if reply else "closed"
    except OSError as err:
        status = type(err).__name__
    finally:
        sock.close()
    return f"{status} after {sent // MiB} MiB", proc_status(pid)["VmHWM"] / 1024


def trickle(port: int) -> str:
    """Send headers a byte every 100 ms; how long until the server answers or closes (15 s max)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    start = time.monotonic()
    header = b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 10_000
    try:
        for byte in header:
            if time.monotonic() - start > 15:
                return "not cut in 15 s"
            readable, _, _ = select.select([sock], [], [], 0.1)
            if readable:
                reply = sock.recv(100)
                what = reply.split(b"\r\n", 1)[0].decode() if reply else "closed"
                return f"{what} after {time.monotonic() - start:.1f} s"
            sock.send(bytes([byte]))
    except OSError as err:
        return f"{type(err).__name__} after {time.monotonic() - start:.1f} s"
    finally:
        sock.close()
    return "never cut"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        run_server(args.serve)
        return 0
    bodies = {size: filter_body(size) for size in SIZES}
    floors = {size: statistics.median(floor_ms(bodies[size], args.requests)) for size in SIZES}
    print(
        "HTTP servers: filter-shaped POST (NodeNames, ~45-byte names), keep-alive, "
        f"{args.requests} requests; floor = the same JSON work without HTTP"
    )
    print("floor: " + ", ".join(f"{size} names p50 {floors[size]:.2f} ms" for size in SIZES))
    print(
        f"{'server':9} {'5k p50 ms':>10} {'5k p99':>7} {'x floor':>7} {'20k p50 ms':>10} {'20k p99':>7} "
        f"{'x floor':>7} {'GET us':>7} {'8-client rps':>12} | {'1k half-open':>20} {'answered':>9} | "
        f"{'200 MB POST':>24} {'peak MiB':>8} | trickled headers"
    )
    rows: list[Row] = []
    for name in SERVERS:
        if not available(name):
            print(f"{name:9} not installed")
            continue
        with server_process(name) as (pid, port):
            row = [f"{name:9}"]
            for size in SIZES:
                samples = post_ms(port, bodies[size], args.requests)
                p50 = statistics.median(samples)
                row.append(f"{p50:10.2f} {percentile(samples, 0.99):7.2f} {p50 / floors[size]:7.2f}")
                if name == PRODUCT:
                    what = f"{name} HTTP server, filter-shaped POST p50, {size:,} names"
                    ok = p50 <= FLOOR_RATIO * floors[size]
                    rows.append(Row(what, p50, "ms", floors[size], f"<= {FLOOR_RATIO:g}x floor", ok))
            get_us = small_get_us(port, args.requests * 20)
            row.append(f"{get_us:7.0f}")
            row.append(f"{concurrent_rps(port, 8, args.requests * 5):12.0f}")
            threads, rss, answered = half_open(pid, port)
            row.append(f"| {threads:5d} thr +{rss:6.1f} MiB {answered:>9} |")
            status, peak = big_post(pid, port)
            row.append(f"{status:>24} {peak:8.0f} |")
            row.append(trickle(port))
            print(" ".join(row), flush=True)
            if name == PRODUCT:
                rows.append(
                    Row(
                        f"{name} HTTP server, GET /healthz p50",
                        get_us,
                        "µs",
                        None,
                        "<= 1,000 µs",
                        get_us <= GET_BAR_US,
                    )
                )
                held = f"{name} HTTP server threads, {HALF_OPEN:,} half-open connections held"
                ok = answered != "-" and threads <= MAX_THREADS
                rows.append(Row(held, threads, "threads", None, f"request answered, <= {MAX_THREADS}", ok))
    record(rows)
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
