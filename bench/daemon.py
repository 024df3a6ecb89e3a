"""Latency of the running daemon against the kubelet emulator, and its memory.

Bars (SPEC §12): re-registration <= 1 s after `kubelet.sock` is recreated; a health change visible
in ListAndWatch <= 1 s; daemon RSS <= 120 MB with 8 GPUs. The daemon runs as a subprocess with 8
fake 141 GB GPUs in vGPU mode (three resources) and --gpu-memory-factor=auto, talking to the
API-server emulator (so the Kubernetes client is loaded, as in a real deployment). Floors, in the
same run before the daemon starts: bench/floor_plugin.py's re-registration (serve again and
Register, in this process, after each kubelet restart) and the RSS of its process.
Run: `.venv/bin/python bench/daemon.py [--rounds N]`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import floor_plugin
from common import daemon_command, percentiles
from report import Row, record

from deviceplugin.gpu.fake import fake_uuid
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator

RESOURCES = ("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores")
BAR_S = 1.0
RSS_BAR_MB = 120.0


def streaming(kubelet: KubeletEmulator, restarts: int) -> bool:
    states = [kubelet.resource(name) for name in RESOURCES]
    return kubelet.restarts == restarts and all(s is not None and s.connected and s.messages for s in states)


def gpu_health(kubelet: KubeletEmulator, uuid: str, health: str) -> bool:
    for name in RESOURCES:
        state = kubelet.resource(name)
        if state is None or any(h != health for d, h in state.devices.items() if d.startswith(uuid)):
            return False
    return True


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def summary(name: str, samples: list[float]) -> float:
    samples = sorted(samples)
    worst = samples[-1]
    print(
        f"{name:34} n={len(samples):3} p50={statistics.median(samples) * 1000:6.0f} ms "
        f"p95={samples[int(len(samples) * 0.95) - 1] * 1000:6.0f} ms max={worst * 1000:6.0f} ms"
    )
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dpbench", dir="/tmp"))
    events = work / "events.jsonl"
    command = daemon_command(
        work,
        "bench",
        "8x143771",
        [
            "--fake-gpu-events",
            str(events),
            "--gpu-strategy",
            "vgpu",
            "--gpu-memory-factor",
            "auto",
            "--health-recovery-period",
            "0.2",
            "--log-level",
            "warning",
        ],
    )
    try:
        with KubeletEmulator(work / "floor") as kubelet:  # its own: the daemon's kubelet never saw it
            floors = Floors(floor_reregistration(kubelet, args.rounds), floor_rss(kubelet))
        with KubeletEmulator(work / "dp") as kubelet, ApiServerEmulator() as apiserver:
            apiserver.create("nodes", {"metadata": {"name": "bench"}})
            command += ["--kubeconfig", str(apiserver.write_kubeconfig(work / "kubeconfig"))]
            daemon = subprocess.Popen(command, stderr=subprocess.DEVNULL)
            try:
                return run_rounds(kubelet, daemon, events, args.rounds, floors)
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(30)
    finally:
        shutil.rmtree(work)


@dataclass(frozen=True)
class Floors:
    reregister_s: list[float]
    rss_mb: float


def floor_reregistration(kubelet: KubeletEmulator, rounds: int) -> list[float]:
    """Seconds from kubelet's new socket to the minimal plugin's Register answer: serve again (the
    restart removed the plugin's socket) and register, with nothing to notice or rebuild."""
    samples = []
    for _ in range(rounds):
        kubelet.restart()
        server = floor_plugin.serve(kubelet.directory)
        floor_plugin.register(kubelet.directory)
        samples.append(time.monotonic() - (kubelet.socket_created_at or 0))
        server.stop(None)
    return samples


def floor_rss(kubelet: KubeletEmulator) -> float:
    """RSS of the minimal grpcio plugin process once registered."""
    before = len(kubelet.registrations)
    plugin = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "floor_plugin.py"), str(kubelet.directory)]
    )
    try:
        if not kubelet.wait_for(lambda k: len(k.registrations) > before, 60):
            raise RuntimeError("the floor plugin never registered")
        return rss_mb(plugin.pid)
    finally:
        plugin.send_signal(signal.SIGTERM)
        plugin.wait(30)


def run_rounds(
    kubelet: KubeletEmulator, daemon: subprocess.Popen[bytes], events: Path, rounds: int, floors: Floors
) -> int:
    started = time.monotonic()
    if not kubelet.wait_for(lambda k: streaming(k, 0), 60):
        print("the daemon never registered")
        return 1
    print(f"first registration {time.monotonic() - started:.2f} s after launch (includes Python start-up)")
    restarts, unhealthy, healthy = [], [], []
    for n in range(1, rounds + 1):
        kubelet.restart()
        if not kubelet.wait_for(lambda k, n=n: streaming(k, n), 30):  # type: ignore[misc]
            print("re-registration did not happen")
            return 1
        restarts.append(max(r.at for r in kubelet.registrations[-3:]) - (kubelet.socket_created_at or 0))
    uuid = fake_uuid(5)
    for _ in range(rounds):
        began = time.monotonic()
        with events.open("a") as out:
            out.write(json.dumps({"xid": 79, "uuid": uuid}) + "\n")
        kubelet.wait_for(lambda k: gpu_health(k, uuid, "Unhealthy"), 30)
        unhealthy.append(time.monotonic() - began)
        began = time.monotonic()
        kubelet.wait_for(lambda k: gpu_health(k, uuid, "Healthy"), 30)
        healthy.append(time.monotonic() - began)
    restart_worst = summary("re-registration after restart", restarts)
    unhealthy_worst = summary("Xid 79 -> Unhealthy in all 3", unhealthy)
    summary("recovery (0.2 s quiet period + probe)", healthy)
    summary("floor: minimal plugin re-registration", floors.reregister_s)
    rss = rss_mb(daemon.pid)
    floor_worst = percentiles(floors.reregister_s)[2]
    rows = [
        Row(
            f"re-registration after a kubelet restart, worst of {rounds}",
            restart_worst * 1000,
            "ms",
            floor_worst * 1000,
            f"<= {BAR_S * 1000:g} ms (floor: minimal plugin, worst)",
            restart_worst <= BAR_S,
        ),
        Row(
            f"Xid 79 -> Unhealthy in ListAndWatch (3 resources), worst of {rounds}",
            unhealthy_worst * 1000,
            "ms",
            None,
            f"<= {BAR_S * 1000:g} ms",
            unhealthy_worst <= BAR_S,
        ),
        Row(
            "daemon RSS, 8 GPUs, vGPU (3 resources), no pods",
            rss,
            "MB",
            floors.rss_mb,
            f"<= {RSS_BAR_MB:g} MB (floor: minimal grpcio plugin)",
            rss <= RSS_BAR_MB,
        ),
    ]
    record(rows)
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
