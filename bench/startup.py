"""Start-up: process start -> first Register on kubelet's socket, beside a minimal grpcio plugin.

Target (issue 15 item 5): the daemon's first Register within 2x the floor, the median start of
bench/floor_plugin.py (imports grpc and the generated stubs, serves on a Unix socket and
registers), measured in the same run, starts interleaved. The daemon runs as in a deployment:
8 fake 80 GB GPUs, share mode, with the API server (emulated, in a process of its own, so that
answering the daemon's requests does not hold up the kubelet emulator's clock), its modules
byte-compiled as the image's wheel install leaves them. Each start gets a new kubelet directory
and state directory (no ledger yet: a node's first start, which asks kubelet's pod-resources
whether a ledger was lost, and would read the API before registering if containers held the
node's devices), then starts again on the same ones (a restart: the ledger kept). Also the wall time
of `deviceplugin --help` and `deviceplugin run --help`, against a bare `python -c pass`.
Run: `.venv/bin/python bench/startup.py [--starts N]`.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import multiprocessing
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from common import daemon_command
from report import Row, record

import deviceplugin
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator

HERE = Path(__file__).resolve().parent
RATIO = 2.0
HELP_RATIO = 3.0


def serve_api(conn: Connection, kubeconfig: Path) -> None:
    with ApiServerEmulator() as apiserver:
        apiserver.create("nodes", {"metadata": {"name": "bench"}})
        conn.send(str(apiserver.write_kubeconfig(kubeconfig)))
        with contextlib.suppress(EOFError):
            conn.recv()  # serve until the pipe closes


def first_register_s(command: list[str], directory: Path) -> float:
    """Seconds from launching `command` to kubelet's answer to its first Register; kubelet serves
    pod-resources at `pod_resources(directory)`, as every kubelet does."""
    with KubeletEmulator(directory, pod_resources_socket=pod_resources(directory)) as kubelet:
        began = time.monotonic()
        process = subprocess.Popen(command)
        try:
            registered = kubelet.wait_for(
                lambda k: any(r.ok for r in k.registrations) or process.poll() is not None, 60
            )
            if not registered or process.poll() is not None:
                raise RuntimeError(f"no Register (exit {process.poll()}): {' '.join(command)}")
            return min(r.at for r in kubelet.registrations if r.ok) - began
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


def pod_resources(directory: Path) -> Path:
    return directory.parent / "pod-resources.sock"


def wall_s(command: list[str]) -> float:
    began = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - began


def compile_product() -> None:
    """Byte-compile the product's modules, as `pip install` of its wheel does in the image: with
    PYTHONDONTWRITEBYTECODE set (this sandbox sets it, the image too) a source checkout would
    otherwise compile every module at every start, a cost no deployed daemon pays."""
    if not compileall.compile_dir(Path(deviceplugin.__file__).parent, quiet=1):
        raise RuntimeError("the product's modules do not compile")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=7)
    args = parser.parse_args()
    compile_product()
    work = Path(tempfile.mkdtemp(prefix="dpstart", dir="/tmp"))
    spawn = multiprocessing.get_context("spawn")
    conn, child_conn = spawn.Pipe()
    api = spawn.Process(target=serve_api, args=(child_conn, work / "kubeconfig"))
    api.start()
    floor, daemon, restart = [], [], []
    try:
        kubeconfig = conn.recv()
        for n in range(args.starts):
            floor.append(
                first_register_s(
                    [sys.executable, str(HERE / "floor_plugin.py"), str(work / f"f{n}")], work / f"f{n}"
                )
            )
            plugins = work / f"d{n}" / "dp"
            extra = [
                *("--kubeconfig", kubeconfig, "--gpu-memory-factor", "auto", "--log-level", "warning"),
                *("--pod-resources-socket", str(pod_resources(plugins))),
            ]
            command = daemon_command(work / f"d{n}", "bench", "8x81920", extra)
            daemon.append(first_register_s(command, plugins))
            restart.append(first_register_s(command, plugins))
    finally:
        conn.close()
        api.join(10)
        api.kill()
        shutil.rmtree(work)
    bare = [wall_s([sys.executable, "-c", "pass"]) for _ in range(args.starts)]
    cli = [sys.executable, "-m", "deviceplugin.cli"]
    helps = [wall_s([*cli, "--help"]) for _ in range(args.starts)]
    run_helps = [wall_s([*cli, "run", "--help"]) for _ in range(args.starts)]
    floor_ms, daemon_ms, restart_ms, bare_ms = (
        statistics.median(s) * 1000 for s in (floor, daemon, restart, bare)
    )
    help_ms, run_help_ms = (statistics.median(s) * 1000 for s in (helps, run_helps))
    print(f"{args.starts} starts each; medians:")
    for name, value, samples in (
        ("minimal grpcio plugin", floor_ms, floor),
        ("deviceplugin run", daemon_ms, daemon),
        ("deviceplugin restart", restart_ms, restart),
    ):
        print(f"{name:22} start -> Register {value:6.0f} ms  {sorted(round(s * 1000) for s in samples)}")
    # `run --help` imports what `run`'s options are made of (deviceplugin.config); no target of its own
    print(f"python -c pass {bare_ms:.0f} ms, --help {help_ms:.0f} ms, run --help {run_help_ms:.0f} ms")
    rows = [
        Row(
            "start -> first Register (8 GPUs, share, with API)",
            daemon_ms,
            "ms",
            floor_ms,
            f"ratio <= {RATIO:g} (floor: minimal grpcio plugin)",
            daemon_ms <= RATIO * floor_ms,
        ),
        Row(
            "restart -> first Register (ledger kept, same node)",
            restart_ms,
            "ms",
            floor_ms,
            f"ratio <= {RATIO:g} (floor: minimal grpcio plugin)",
            restart_ms <= RATIO * floor_ms,
        ),
        Row(
            "`deviceplugin --help` wall time",
            help_ms,
            "ms",
            bare_ms,
            f"ratio <= {HELP_RATIO:g} (floor: python -c pass)",
            help_ms <= HELP_RATIO * bare_ms,
        ),
    ]
    record(rows)
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
