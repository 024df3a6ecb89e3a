"""The daemon's metrics listener holds its limits against hostile clients (issue 13 F4): the daemon
in a subprocess, raw sockets. It used to start one thread per connection without a cap (1,000
half-open connections: 1,013 threads) and had no time limit at all."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from deviceplugin.config import load_config
from kubesim.kubelet import KubeletEmulator
from tests.daemons import Daemon, eventually, streaming, wait
from tests.e2e.test_vgpu import get, samples
from tests.rawhttp import HALF_SENT, closed_silently, half_open, reply, send, trickle

Start = Callable[..., Daemon]


def started(kubelet: KubeletEmulator, start: Start, *args: str) -> tuple[Daemon, tuple[str, int]]:
    daemon = start("--fake-gpus", "1x1000", *args)
    wait(kubelet, streaming("volcano.sh/gpu-memory"), daemon)
    parts = urlsplit(daemon.metrics_url())
    return daemon, (parts.hostname or "127.0.0.1", parts.port or 80)


def threads(daemon: Daemon) -> int:
    for line in Path(f"/proc/{daemon.process.pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def refusals(daemon: Daemon, reason: str) -> float:
    return samples(daemon, "volcano_gpu_plugin_http_refusals_total")[(("reason", reason),)]


def test_a_thousand_half_open_connections_take_no_thread_and_probes_still_pass(
    kubelet: KubeletEmulator, start: Start
) -> None:
    daemon, address = started(kubelet, start)
    url = daemon.metrics_url()
    assert get(url + "/healthz") == (200, "ok\n")  # its workers are up
    before = threads(daemon)
    with half_open(address, 1000):
        # Answered after the daemon has taken every earlier connection off its accept queue.
        assert get(url + "/healthz") == (200, "ok\n")
        grown = threads(daemon) - before
        assert grown <= 4, f"{grown} more threads with 1,000 half-open connections"
    assert refusals(daemon, "evicted") >= 1000 - 64  # the idle longest made room for the probe


def test_a_client_that_stops_sending_is_cut_off(kubelet: KubeletEmulator, start: Start) -> None:
    daemon, address = started(kubelet, start, "--metrics-request-timeout", "0.5")
    with send(address, b"") as silent, send(address, HALF_SENT) as half:
        assert closed_silently(silent)
        assert reply(half).status == 408
    answer = trickle(address, b"GET /metrics HTTP/1.1\r\nX-Slow: ")
    assert answer is not None and answer.status == 408
    assert b"did not arrive whole within 0.5 s" in answer.body
    assert refusals(daemon, "timeout") == 2


def test_a_reload_applies_a_new_request_time_limit(
    kubelet: KubeletEmulator, start: Start, workdir: Path
) -> None:
    config = workdir / "config.yaml"
    config.write_text("metrics-request-timeout: 600\n")
    daemon, address = started(kubelet, start, "--config", str(config))
    config.write_text("metrics-request-timeout: 0.5\n")
    daemon.process.send_signal(signal.SIGHUP)
    eventually(lambda: "metrics request timeout changed" in daemon.output(), daemon)
    with send(address, HALF_SENT) as half:
        assert reply(half).status == 408


def test_a_body_is_refused_unread(kubelet: KubeletEmulator, start: Start) -> None:
    daemon, address = started(kubelet, start)
    with send(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n") as sock:
        assert reply(sock).status == 413
    with send(address, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}") as sock:
        assert reply(sock).status == 405
    assert refusals(daemon, "body_too_large") == 1


def test_the_listener_is_on_loopback_unless_given_an_address() -> None:
    config = load_config({"node-name": "n1"}, env={})
    assert config.metrics_address == "127.0.0.1:9460"
    assert config.metrics_request_timeout == 10.0
