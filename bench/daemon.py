"""Latency of the running daemon against the kubelet emulator, and its memory.

Bars (SPEC §12): re-registration <= 1 s after `kubelet.sock` is recreated; a health change visible
in ListAndWatch <= 1 s; daemon RSS <= 120 MB with 8 GPUs. The daemon runs as a subprocess with 8
fake 141 GB GPUs in vGPU mode (three resources) and --gpu-memory-factor=auto, talking to the
API-server emulator (so the Kubernetes client is loaded, as in a real deployment).
Run: `.venv/bin/python bench/daemon.py [--rounds N]`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import daemon_command

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
        with KubeletEmulator(work / "dp") as kubelet, ApiServerEmulator() as apiserver:
            apiserver.create("nodes", {"metadata": {"name": "bench"}})
            command += ["--kubeconfig", str(apiserver.write_kubeconfig(work / "kubeconfig"))]
            daemon = subprocess.Popen(command, stderr=subprocess.DEVNULL)
            try:
                return run_rounds(kubelet, daemon, events, args.rounds)
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(30)
    finally:
        shutil.rmtree(work)


def run_rounds(kubelet: KubeletEmulator, daemon: subprocess.Popen[bytes], events: Path, rounds: int) -> int:
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
    worst = max(
        summary("re-registration after restart", restarts), summary("Xid 79 -> Unhealthy in all 3", unhealthy)
    )
    summary("recovery (0.2 s quiet period + probe)", healthy)
    rss = rss_mb(daemon.pid)
    print(f"daemon RSS with 8 GPUs, 3 resources: {rss:.0f} MB (bar {RSS_BAR_MB:.0f} MB)")
    ok = worst <= BAR_S and rss <= RSS_BAR_MB
    print(f"{'meets' if ok else 'MISSES'} the bars (<= {BAR_S:.0f} s, <= {RSS_BAR_MB:.0f} MB)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
