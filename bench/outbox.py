"""The outbox's CPU per applied patch against the CPU of one Allocate (issue 15 item 3).

One process holds what the daemon's Allocate and outbox use (the pod cache, a real ledger on disk,
the share-mode allocator, the outbox worker); the API-server emulator runs in a process of its own
at a lower CPU priority (`--api-nice`), as a real API server runs on other machines. CPU is per
thread (`time.thread_time`, the worker thread's CPU clock): the pod cache's watch thread and the
emulator are counted on neither side. An Allocate queues a pod's `gpu-assigned` and the release of
Volcano's node lock; its gRPC framing is not counted, so the floor is the least an Allocate costs.
Pods are admitted 10 at a time, as a node has few pending, so that the floor carries no pending
list a node does not have.

Three shapes, each on its own pods:
- lone: every Allocate is followed by the outbox pass it wakes, run in the main thread, as a lone
  Allocate's patches go out at once (a pod patch and a lock release per pass);
- stream: the worker thread runs as in the daemon while Allocates come every `--pace-ms` (as
  bench/allocate.py paces them): its passes gather what arrived since the last;
- backlog: `--backlog` Allocates back to back, then passes in the main thread drain the outbox.
Each row is the outbox's CPU per applied patch, the issue's unit: per PATCH request the API
server answered (a pod's annotations, or a node's lock release, which a pass merges over its
pods), median of `--runs` runs (fresh processes and ledgers); the floor, for every row, the mean
CPU of the lone shape's Allocates (median of the runs). The per-pod figure is printed per run
without a target: a lone Allocate's pass sends two requests on two objects (nothing to merge) and
first fsyncs the ledger's log (docs/ledger.md), which together cost more than the Allocate.
`--profile` prints where the main thread's outbox passes spend their CPU (cProfile, one run).
Run: `.venv/bin/python bench/outbox.py [--lone 500] [--stream 500] [--backlog 2000] [--runs 3]`.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import multiprocessing
import os
import pstats
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from report import Row, record

from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.health import HealthState
from deviceplugin.kube.api import Kube, load_client
from deviceplugin.kube.events import EventRecorder
from deviceplugin.kube.podcache import PodCache
from deviceplugin.ledger import Ledger
from deviceplugin.plugin.devices import RESOURCES, DeviceList, Layout
from deviceplugin.plugin.gpushare import GpushareAllocator
from deviceplugin.plugin.outbox import OutboxWorker
from kubesim.apiserver import ApiServerEmulator

NODE = "bench"
UNITS = 10  # MiB (device IDs) per pod
GPUS = tuple(GpuInfo(index=i, uuid=f"GPU-{i}", model="Fake GPU", memory_mib=81920) for i in range(2))
ASSIGNED = "volcano.sh/gpu-assigned"
# Pods created at a time, each batch pending when its Allocates start: a node has few pending pods,
# and Allocate's CPU is not to grow with a pending list no node has.
ADMITTED = 10


def serve_api(conn: Connection, kubeconfig: Path, nice: int) -> None:
    """The API server's process: the node, then the bench's requests: ("create", first, count)
    pending share pods, GPUs in turn, in the scheduler's order; ("count",) how many pods carry
    `gpu-assigned` and how many PATCH requests were answered; None: stop."""
    os.nice(nice)
    with ApiServerEmulator() as apiserver:
        apiserver.create("nodes", {"metadata": {"name": NODE}})
        apiserver.create("namespaces", {"metadata": {"name": "bench"}})
        conn.send(str(apiserver.write_kubeconfig(kubeconfig)))
        with contextlib.suppress(EOFError):
            while (question := conn.recv()) is not None:
                if question[0] == "create":
                    for n in range(question[1], question[1] + question[2]):
                        apiserver.create("pods", pod(n))
                    conn.send(None)
                else:
                    listed = apiserver.list("pods", "bench")
                    assigned = sum(1 for p in listed if p["metadata"]["annotations"].get(ASSIGNED) == "true")
                    conn.send((assigned, apiserver.requests.count(method="PATCH")))


def pod(n: int) -> dict[str, Any]:
    annotations = {"volcano.sh/gpu-index": str(n % len(GPUS)), "volcano.sh/predicate-time": str(n + 1)}
    limits = {"volcano.sh/gpu-memory": str(UNITS)}
    return {
        "metadata": {"name": f"p{n:05d}", "namespace": "bench", "annotations": annotations},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "cuda", "image": "cuda", "resources": {"limits": limits}}],
        },
    }


def device_ids(n: int) -> list[str]:
    """Kubelet's choice for pod n: the next free IDs of its GPU."""
    gpu, slot = n % len(GPUS), n // len(GPUS)
    return [f"{gpu}-{slot * UNITS + k}" for k in range(UNITS)]


def cpu_of(action: Callable[[], object]) -> float:
    """The calling thread's CPU seconds for `action`."""
    began = time.thread_time()
    action()
    return time.thread_time() - began


@dataclass(frozen=True)
class Shape:
    outbox_s: float  # the outbox's CPU over the shape's pods
    allocate_s: float  # the same pods' Allocates
    pods: int
    requests: int  # PATCH requests the outbox sent


@dataclass(frozen=True)
class Run:
    lone: Shape
    stream: Shape
    backlog: Shape


class Node:
    """The daemon's Allocate and outbox in this process, against the emulator's API."""

    def __init__(self, work: Path, kubeconfig: str) -> None:
        kube = Kube(load_client(Path(kubeconfig)))
        self.pods = PodCache(kube, NODE)
        self.ledger = Ledger(work / "ledger.db")
        self.outbox = OutboxWorker(self.ledger, kube, self.pods)  # never started: its passes run here
        self.events = EventRecorder(kube, NODE)
        devices = DeviceList(RESOURCES["share"][0], GPUS, Layout())
        health = HealthState(tuple(gpu.uuid for gpu in GPUS))
        self.allocator = GpushareAllocator(
            devices, health, self.pods, self.ledger, self.events, node_name=NODE, on_outbox=self.outbox.wake
        )

    @contextlib.contextmanager
    def running(self) -> Iterator[Node]:
        self.pods.start()
        self.events.start()
        try:
            if not self.pods.wait_synced(60):
                raise SystemExit("the pod cache did not list")
            yield self
        finally:
            self.pods.stop()
            self.events.stop()
            self.ledger.close()

    def admit(self, api: Connection, first: int, count: int) -> None:
        """Pods first.. created and in the pod cache (pending, as the scheduler leaves them)."""
        api.send(("create", first, count))
        api.recv()
        if not self.pods.wait_until(lambda cache: len(cache.objects()) >= first + count, 60):
            raise SystemExit("the pod cache did not see the bench's pods")

    def allocate(self, n: int) -> float:
        return cpu_of(lambda: self.allocator.allocate(device_ids(n)))

    def drain(self, profile: cProfile.Profile | None) -> float:
        """The outbox's passes, as its worker runs them, until it is empty: their CPU seconds.
        Between passes the worker asks when the next entry is due (`due_in`, None: none waits),
        one query, as here."""

        def passes() -> None:
            started_by = "wait"
            while True:
                backlog = self.outbox.run_once(started_by)
                if not backlog and self.ledger.due_in() is None:
                    return
                started_by = "backlog" if backlog else "wait"

        if profile is None:
            return cpu_of(passes)
        profile.enable()
        try:
            return cpu_of(passes)
        finally:
            profile.disable()


def patches(api: Connection) -> tuple[int, int]:
    """Pods marked assigned, and PATCH requests answered, so far."""
    api.send(("count",))
    assigned, requests = api.recv()
    return int(assigned), int(requests)


def lone(node: Node, api: Connection, first: int, count: int, profile: cProfile.Profile | None) -> Shape:
    allocate_s = outbox_s = 0.0
    before = patches(api)[1]
    for chunk in range(first, first + count, ADMITTED):
        node.admit(api, chunk, ADMITTED)
        for n in range(chunk, chunk + ADMITTED):
            allocate_s += node.allocate(n)
            outbox_s += node.drain(profile)
    return Shape(outbox_s, allocate_s, count, patches(api)[1] - before)


def stream(node: Node, api: Connection, first: int, count: int, pace_s: float) -> Shape:
    """Allocates every `pace_s` with the worker thread running; its CPU up to an empty outbox."""
    node.admit(api, first, count)
    before = patches(api)[1]
    node.outbox.start()
    try:
        worker = next(thread for thread in threading.enumerate() if thread.name == "outbox")
        assert worker.ident is not None
        clock = time.pthread_getcpuclockid(worker.ident)
        began, allocate_s, due = time.clock_gettime(clock), 0.0, time.perf_counter()
        for n in range(first, first + count):
            time.sleep(max(0.0, due - time.perf_counter()))
            due += pace_s
            allocate_s += node.allocate(n)
        deadline = time.monotonic() + 60
        while node.ledger.outbox_size():
            if time.monotonic() > deadline:
                raise SystemExit("the outbox worker did not catch up within 60 s")
            time.sleep(0.01)
        outbox_s = time.clock_gettime(clock) - began
    finally:
        node.outbox.stop()
    return Shape(outbox_s, allocate_s, count, patches(api)[1] - before)


def backlog(node: Node, api: Connection, first: int, count: int, profile: cProfile.Profile | None) -> Shape:
    allocate_s = 0.0
    before = patches(api)[1]
    for chunk in range(first, first + count, ADMITTED):
        node.admit(api, chunk, ADMITTED)
        allocate_s += sum(node.allocate(n) for n in range(chunk, chunk + ADMITTED))
    outbox_s = node.drain(profile)
    return Shape(outbox_s, allocate_s, count, patches(api)[1] - before)


def one_run(args: argparse.Namespace, profile: cProfile.Profile | None) -> Run:
    work = Path(tempfile.mkdtemp(prefix="dpoutbox", dir="/tmp"))
    spawn = multiprocessing.get_context("spawn")
    conn, child_conn = spawn.Pipe()
    api = spawn.Process(target=serve_api, args=(child_conn, work / "kc", args.api_nice))
    api.start()
    try:
        node = Node(work, conn.recv())
        with node.running():
            run = Run(
                lone=lone(node, conn, 0, args.lone, profile),
                backlog=backlog(node, conn, args.lone, args.backlog, profile),
                stream=stream(node, conn, args.lone + args.backlog, args.stream, args.pace_ms / 1000),
            )
        if patches(conn)[0] != args.lone + args.backlog + args.stream:
            raise SystemExit("a pod was not marked assigned: the outbox lost a patch")
    finally:
        with contextlib.suppress(OSError):
            conn.send(None)
        conn.close()
        api.join(10)
        api.kill()
        shutil.rmtree(work)
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lone", type=int, default=500, help="Allocates each followed by its pass")
    parser.add_argument("--stream", type=int, default=500, help="Allocates paced, the worker running")
    parser.add_argument("--pace-ms", type=float, default=4.0, help="between two Allocates of the stream")
    parser.add_argument("--backlog", type=int, default=2000, help="Allocates queued before one drain")
    parser.add_argument("--runs", type=int, default=3, help="the figures are the median of the runs")
    parser.add_argument("--profile", action="store_true", help="print the outbox's profile (one run)")
    parser.add_argument("--api-nice", type=int, default=10, help="CPU niceness of the API emulator")
    args = parser.parse_args()
    if (args.lone + args.backlog + args.stream) * UNITS > sum(gpu.memory_mib for gpu in GPUS):
        parser.error("the pods do not fit in the GPUs")
    if args.lone % ADMITTED or args.backlog % ADMITTED:
        parser.error(f"--lone and --backlog must be multiples of {ADMITTED}")
    profile = cProfile.Profile(time.thread_time) if args.profile else None  # CPU, not waits
    runs = []
    for number in range(1 if profile else args.runs):
        run = one_run(args, profile)
        runs.append(run)
        for name, shape in (("lone", run.lone), ("stream", run.stream), ("backlog", run.backlog)):
            print(
                f"run {number + 1} {name}: per pod, outbox {shape.outbox_s / shape.pods * 1e6:.0f} µs CPU "
                f"({shape.requests / shape.pods:.2f} PATCH requests, "
                f"{shape.outbox_s / shape.requests * 1e6:.0f} µs each), "
                f"Allocate {shape.allocate_s / shape.pods * 1e6:.0f} µs CPU",
                flush=True,
            )
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
        return 0  # profiled figures are not the product's
    floor = statistics.median(r.lone.allocate_s / r.lone.pods for r in runs) * 1e6
    rows = [
        row(f"outbox CPU per applied patch, {args.lone} lone Allocates", [r.lone for r in runs], floor),
        row(
            f"outbox CPU per applied patch, Allocates every {args.pace_ms:g} ms",
            [r.stream for r in runs],
            floor,
        ),
        row(f"outbox CPU per applied patch, backlog of {args.backlog}", [r.backlog for r in runs], floor),
    ]
    record(rows)
    return 0 if all(r.passed for r in rows) else 1


def row(metric: str, shapes: list[Shape], floor: float) -> Row:
    """The outbox's CPU per PATCH request (median over the runs) against one Allocate's, in µs."""
    value = statistics.median(s.outbox_s / s.requests for s in shapes) * 1e6
    return Row(metric, value, "µs", floor, "ratio <= 1", value <= floor)


if __name__ == "__main__":
    raise SystemExit(main())
