"""Allocate latency over gRPC on a fresh node and after 10,000 live allocations, against an empty
RPC paced the same way, at both SQLite synchronous levels the ledger could use.

Targets (issue 15 item 2): p50 after 10,000 allocations within 1.3x of p50 on a fresh node; p50
<= 2x and p99 <= 3x the floor: an empty RPC (GetDevicePluginOptions) on the same channel, sent
halfway between two Allocates, so it meets the daemon in the same state (idle threads to wake,
the outbox and the pod watch working in the background). The Allocates of a measured window go
out every `--pace-ms`, as kubelet admits pods one at a time, and the pods are bound `ADMITTED`
at a time, a batch ahead of their Allocates: the daemon sees one or two batches pending, as a
node does while kubelet admits pods about as fast as they are bound (a node has few pending
pods; bench/outbox.py binds them alike). The window's pods all pending at once, 500 of them, was
a list no node has, and Allocate's cost grew with it where it walks the pending pods.

The daemon runs as a subprocess (`--strategy share`: `--gpus` fake GPUs of `--gpu-ids` device IDs each)
against the API-server emulator, which runs in a process of its own at a lower CPU priority
(`--api-nice`): a real API server runs on other machines. Every pod asks for `--units` IDs (10:
10 MiB). Kubelet takes a ListAndWatch message of at most 4 MiB, which holds about 164,000 device
IDs over all GPUs, so the node holds (gpus x gpu-ids) / units pods: 16,384 by default, where
100 IDs a pod ran out at 1,638. Pods take the GPUs in turn, and kubelet's pod-resources socket
is absent, so each Allocate picks its pod by arrival order.

`--strategy vgpu` runs the daemon's vGPU mode (HAMi-core under Volcano): `--gpu-ids` MiB per GPU
(one `vgpu-memory` ID per MiB), `--vgpu-split-count` large enough for a `vgpu-number` slot per pod,
a stand-in HAMi-core library under `--hook-path`. Every pod has one container limiting one vGPU,
`--units` MiB and one vgpu-core, placed by `devices-to-allocate`, so kubelet calls three
Allocates per pod, one per resource socket, in an order that changes from pod to pod (kubelet
walks the container's limits, a Go map). The vgpu-memory Allocate of such a container only
accounts but is recorded, and the one that comes second finds its pod through the ledger's row
of the other resource (no pod-resources socket). Each resource's Allocates are reported apart
(vgpu-cores only accounts, without the ledger). One run:
- fresh: `--window` pods, bound a batch ahead of their paced Allocates, each Allocate followed by
  an empty RPC;
- fill: pods and their Allocates up to `--allocations` live ones, 1,000 pods at a time, back to
  back (their p50 is shown, unpaced);
- after: once the API server holds every earlier pod's `gpu-assigned` (vGPU: `bind-phase:
  success`), `--window` more pods, bound and allocated as the fresh ones. Each window starts with
  the same pods pending: its first batch and one more pod, asking 300 IDs (vGPU: two vGPUs of
  300 MiB), for GetPreferredAllocation at the end.
The figures are the median of `--runs` runs (fresh processes each), for each `--ledger-sync`
level (docs/ledger.md: the product commits at NORMAL; FULL, an fsync per commit, is measured
beside it). API requests during the measured Allocates are counted by method: reads would be
synchronous calls on the hot path; PATCHes are the outbox applying `gpu-assigned` in the
background.
Run: `.venv/bin/python bench/allocate.py [--strategy vgpu] [--allocations N] [--runs 3]
[--ledger-sync NORMAL]`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
from common import daemon_command, percentiles
from report import Row, record

from deviceplugin import ledger
from deviceplugin.api import deviceplugin_grpc
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.fit import keys
from deviceplugin.fit.codec import encode_pod_devices
from deviceplugin.fit.model import Assigned
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.gpu.fake import fake_uuid
from deviceplugin.plugin.devices import (
    RESOURCES,
    VGPU_CORES_PER_GPU,
    FactorError,
    Layout,
    Resource,
    check_layout,
)
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator

LAST_UNITS = 300  # one more pod, left pending, for GetPreferredAllocation
FILL_CHUNK = 1000  # pods created at a time for the fill, so that it does not wait for their events
ADMITTED = 10  # pods bound at a time in a measured window, a batch ahead of their Allocates
ASSIGNED = "volcano.sh/gpu-assigned"
PRODUCT_SYNC = ledger.SYNCHRONOUS
# `deviceplugin run` with the ledger's synchronous level from its first argument.
DAEMON = (
    "import sys; from deviceplugin import cli, ledger; "
    "ledger.SYNCHRONOUS = sys.argv.pop(1); sys.exit(cli.main(sys.argv[1:]))"
)


@dataclass(frozen=True)
class Node:
    """The fake node: `gpus` GPUs of `ids` memory device IDs (MiB) each; every pod asks `units`
    of them. vGPU: `split` vgpu-number IDs a GPU (a slot for each pod), `cores` IDs a GPU."""

    gpus: int
    ids: int
    units: int
    strategy: str = "share"
    split: int = 10

    @property
    def resources(self) -> tuple[Resource, ...]:
        return RESOURCES[self.strategy]  # type: ignore[index]

    @property
    def served_mark(self) -> tuple[str, str]:
        """The annotation a pod carries once the outbox has told the API server it is served."""
        return (ASSIGNED, "true") if self.strategy == "share" else (keys.BIND_PHASE, keys.BIND_PHASE_SUCCESS)


def pod_spec(node: Node, n: int, units: int, vgpus: int) -> tuple[dict[str, str], dict[str, str]]:
    """The limits and scheduler annotations of pod n on its GPU (vGPU: `vgpus` GPUs from it)."""
    if node.strategy == "share":
        limits = {"volcano.sh/gpu-memory": str(units)}
        return limits, {
            "volcano.sh/gpu-index": str(n % node.gpus),
            "volcano.sh/predicate-time": str(1_000 + n),
        }
    number, memory, cores = (resource.name for resource in node.resources)
    limits = {number: str(vgpus), memory: str(units), cores: "1"}
    slot = encode_pod_devices(
        [[Assigned(fake_uuid((n + k) % node.gpus), None, "NVIDIA", units, 1) for k in range(vgpus)]]
    )
    annotations = {
        keys.VGPU_NODE: "bench",
        keys.VGPU_TIME: str(1_000 + n),
        keys.DEVICES_TO_ALLOCATE: slot,
        keys.VGPU_IDS_NEW: slot,
        keys.BIND_PHASE: keys.BIND_PHASE_ALLOCATING,
    }
    return limits, annotations


def make_pods(apiserver: ApiServerEmulator, node: Node, first: int, count: int, last: bool = False) -> None:
    """Pods first.. on GPUs in turn, each asking `units` devices (the node's), in the scheduler's
    order; `last`: the pod left pending, asking `LAST_UNITS` (vGPU: two vGPUs of that many MiB),
    which no measured Allocate asks."""
    for n in range(first, first + count):
        limits, annotations = pod_spec(node, n, LAST_UNITS if last else node.units, 2 if last else 1)
        apiserver.create(
            "pods",
            {
                "metadata": {"name": f"p{n:05d}", "namespace": "bench", "annotations": annotations},
                "spec": {
                    "nodeName": "bench",
                    "containers": [{"name": "cuda", "image": "cuda", "resources": {"limits": limits}}],
                },
            },
        )


def serve_api(conn: Connection, kubeconfig: Path, node: Node, last: int, nice: int) -> None:
    """The API server's process: the node, then the bench's requests: ("create", first, count)
    pods; ("assigned",) how many pods are marked served (`Node.served_mark`); ("requests", since,
    until) the requests made in that window, by method; None: stop. Pod `last` (the highest
    number) is left pending for GetPreferredAllocation."""
    os.nice(nice)
    with ApiServerEmulator() as apiserver:
        apiserver.create("nodes", {"metadata": {"name": "bench"}})
        apiserver.create("namespaces", {"metadata": {"name": "bench"}})
        make_pods(apiserver, node, last, 1, last=True)
        mark, value = node.served_mark
        conn.send(str(apiserver.write_kubeconfig(kubeconfig)))
        with contextlib.suppress(EOFError):
            while (question := conn.recv()) is not None:
                if question[0] == "create":
                    make_pods(apiserver, node, question[1], question[2])
                    conn.send(None)
                elif question[0] == "assigned":
                    pods = apiserver.list("pods", "bench")
                    conn.send(sum(1 for p in pods if p["metadata"]["annotations"].get(mark) == value))
                else:
                    _, since, until = question
                    conn.send(
                        collections.Counter(
                            r.method
                            for r in apiserver.requests.records()
                            if since <= r.started_at <= until and not r.watch
                        )
                    )


def ask(api: Connection, *question: object) -> Any:
    api.send(question)
    return api.recv()


Latency = tuple[float, float]  # p50, p99 (ms)


@dataclass(frozen=True)
class Run:
    """One run's figures; Allocate figures by resource name."""

    fresh: dict[str, Latency]  # Allocate p50, p99, paced, on a fresh node
    after: dict[str, Latency]  # the same after `allocations` live ones
    floor: Latency  # the paced empty RPC's p50, p99 over both windows
    fill: dict[str, tuple[float, float]]  # unpaced Allocate p50 over the fill's first and last `window`
    api: collections.Counter[str]  # API requests during the measured Allocates, by method
    preferred_ms: float  # GetPreferredAllocation p50 from every free ID
    steered: bool  # its answer lies on the pending pod's GPU(s)


DEFAULTS = {"share": (81920, 10), "vgpu": (20480, 3)}  # --gpu-ids, --units


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=tuple(DEFAULTS), default="share", help="the daemon's mode")
    parser.add_argument("--allocations", type=int, default=10_000, help="live allocations before 'after'")
    parser.add_argument("--window", type=int, default=500, help="paced Allocates per measured window")
    parser.add_argument("--pace-ms", type=float, default=4.0, help="between two paced Allocates")
    parser.add_argument("--runs", type=int, default=3, help="the figures are the median of the runs")
    parser.add_argument("--gpus", type=int, default=2, help="fake GPUs on the node")
    parser.add_argument(
        "--gpu-ids", type=int, help="device IDs (MiB) per GPU (default: share 81920, vgpu 20480)"
    )
    parser.add_argument("--units", type=int, help="device IDs each pod asks for (default: share 10, vgpu 3)")
    parser.add_argument(
        "--ledger-sync",
        choices=("FULL", "NORMAL"),
        action="append",
        help=f"the ledger's SQLite synchronous level; repeat it for both (default: {PRODUCT_SYNC}, FULL)",
    )
    parser.add_argument(
        "--api-nice",
        type=int,
        default=10,
        help="CPU niceness of the API emulator's process (0: compete with the daemon as an equal)",
    )
    args = parser.parse_args()
    ids, units = DEFAULTS[args.strategy]
    pods = args.allocations + args.window
    if args.strategy == "vgpu" and args.gpus < 2:
        parser.error("--strategy vgpu needs 2 GPUs or more (the pending pod asks two vGPUs)")
    split = -(-pods // args.gpus) + 1  # a vgpu-number slot for every pod, and one left
    node = Node(args.gpus, args.gpu_ids or ids, args.units or units, args.strategy, split)
    fake = [GpuInfo(index=i, uuid=fake_uuid(i), model="bench", memory_mib=node.ids) for i in range(node.gpus)]
    try:  # the daemon's own check: its device list must fit in one message to kubelet
        check_layout(node.resources, fake, Layout(split_count=node.split))
    except FactorError as err:
        parser.error(f"{node.gpus} GPUs of {node.ids} IDs: {err}")
    if -(-(pods + 1) // node.gpus) * node.units > node.ids:
        most = node.gpus * node.ids // node.units - 1
        parser.error(
            f"{pods:,} pods of {node.units} IDs do not fit in {node.gpus} GPUs of {node.ids} IDs: {most:,} do"
        )
    if args.window > args.allocations:
        parser.error("--window must not exceed --allocations")
    if args.window % ADMITTED:
        parser.error(f"--window must be a multiple of {ADMITTED}")
    levels = args.ledger_sync or [PRODUCT_SYNC, *({"FULL", "NORMAL"} - {PRODUCT_SYNC})]
    results: dict[str, Sequence[Run]] = {}
    for level in levels:
        print(f"\n--- {node.strategy} node, ledger synchronous={level}", flush=True)
        results[level] = [one_run(args, node, pods, level, n) for n in range(args.runs)]
    return report(results, args, node)


def daemon_options(node: Node, work: Path) -> list[str]:
    """The daemon's options for the node's mode (vGPU: a stand-in HAMi-core library)."""
    if node.strategy == "share":
        return []
    hook = work / "hook"
    hook.mkdir()
    (hook / "libvgpu.so").write_bytes(b"HAMi-core stand-in")
    return ["--gpu-strategy", "vgpu", "--vgpu-split-count", str(node.split), "--hook-path", str(hook)]


def one_run(args: argparse.Namespace, node: Node, pods: int, sync: str, number: int) -> Run:
    work = Path(tempfile.mkdtemp(prefix="dpalloc", dir="/tmp"))
    spawn = multiprocessing.get_context("spawn")
    conn, child_conn = spawn.Pipe()
    api = spawn.Process(target=serve_api, args=(child_conn, work / "kc", node, pods, args.api_nice))
    api.start()
    try:
        kubeconfig = conn.recv()
        with KubeletEmulator(work / "dp"):
            extra = ["--kubeconfig", kubeconfig, "--log-level", "warning"]
            extra += ["--pod-resources-socket", str(work / "none.sock"), *daemon_options(node, work)]
            command = daemon_command(work, "bench", f"{node.gpus}x{node.ids}", extra)
            command[1:3] = ["-c", DAEMON, sync]  # in place of `-m deviceplugin.cli`
            daemon = subprocess.Popen(command)
            try:
                run = measure(conn, [work / "dp" / r.socket for r in node.resources], args, node, pods)
            finally:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(60)
    finally:
        with contextlib.suppress(OSError):
            conn.send(None)
        conn.close()
        api.join(10)
        api.kill()
        shutil.rmtree(work)
    for resource in node.resources:
        fresh, after = run.fresh[resource.name], run.after[resource.name]
        print(
            f"run {number + 1} {resource.name}: Allocate p50 fresh {fresh[0]:.3f} ms, after "
            f"{args.allocations:,} {after[0]:.3f} ms; p99 {fresh[1]:.3f} / {after[1]:.3f} ms",
            flush=True,
        )
    print(
        f"run {number + 1}: paced empty RPC p50 {run.floor[0]:.3f} ms, p99 {run.floor[1]:.3f} ms", flush=True
    )
    return run


ORDERS = tuple(itertools.permutations(range(3)))  # kubelet's order of a vGPU container's Allocates


def requests(node: Node, n: int) -> list[tuple[int, pb.AllocateRequest]]:
    """Kubelet's Allocates for pod n, in its order: (the resource's place in `node.resources`,
    the request naming the next free IDs of the pod's GPU)."""
    gpu, slot = n % node.gpus, n // node.gpus
    memory = [slot * node.units + k for k in range(node.units)]
    if node.strategy == "share":
        ids = [[f"{gpu}-{k}" for k in memory]]
    else:
        uuid = fake_uuid(gpu)
        ids = [
            [f"{uuid}-{slot}"],
            [f"{uuid}-memory-{k}" for k in memory],
            [f"{uuid}-core-{slot % VGPU_CORES_PER_GPU}"],  # only accounted: any of the GPU's does
        ]
    order = ORDERS[n % len(ORDERS)] if len(ids) == 3 else (0,)
    return [
        (r, pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids[r])]))
        for r in order
    ]


Stubs = Sequence[deviceplugin_grpc.DevicePluginStub]  # one per resource, in `node.resources` order


def paced(
    plugins: Stubs,
    api: Connection,
    node: Node,
    first: int,
    count: int,
    *,
    pace_s: float,
) -> tuple[dict[int, list[float]], list[float]]:
    """Allocates for pods first.. every `pace_s`, an empty RPC on the same channel halfway between
    two: both in ms, Allocates by resource. The first batch of `ADMITTED` pods is bound already;
    each next one is bound as the batch before it starts, then half a pace passes (the daemon
    takes in the new pods as it would between two admissions)."""
    allocates: dict[int, list[float]] = collections.defaultdict(list)
    empties: list[float] = []
    due = time.perf_counter()
    for n in range(first, first + count):
        ahead = n + ADMITTED
        if (n - first) % ADMITTED == 0 and ahead < first + count:
            ask(api, "create", ahead, min(ADMITTED, first + count - ahead))
            due = max(due, time.perf_counter() + pace_s / 2)
        for r, request in requests(node, n):
            for calls, method, message in (
                (allocates[r], plugins[r].Allocate, request),
                (empties, plugins[r].GetDevicePluginOptions, pb.Empty()),
            ):
                time.sleep(max(0.0, due - time.perf_counter()))
                began = time.perf_counter()
                method(message, timeout=10)
                calls.append((time.perf_counter() - began) * 1000)
                due += pace_s / 2
    return allocates, empties


def back_to_back(plugins: Stubs, node: Node, first: int, count: int) -> dict[int, list[float]]:
    took: dict[int, list[float]] = collections.defaultdict(list)
    for n in range(first, first + count):
        for r, request in requests(node, n):
            began = time.perf_counter()
            plugins[r].Allocate(request, timeout=10)
            took[r].append((time.perf_counter() - began) * 1000)
    return took


def settle(api: Connection, assigned: int, timeout_s: float = 600.0) -> None:
    """Until the API server holds `gpu-assigned` on `assigned` pods (the outbox has caught up)."""
    deadline = time.monotonic() + timeout_s
    while ask(api, "assigned") < assigned:
        if time.monotonic() > deadline:
            raise SystemExit(f"the outbox did not mark {assigned} pods assigned within {timeout_s:.0f} s")
        time.sleep(0.2)
    time.sleep(1)  # the watch events that follow reach the daemon's pod cache


def preferred_request(node: Node, pods: int) -> tuple[int, pb.PreferredAllocationRequest, tuple[str, ...]]:
    """GetPreferredAllocation for the pending pod (number `pods`) from every free ID: the
    resource's place (the first: gpu-memory, vgpu-number), the request, and what the IDs on the
    pod's GPU(s) start with."""
    used = [-(-(pods - gpu) // node.gpus) for gpu in range(node.gpus)]  # slots taken on each GPU
    wanted: tuple[str, ...]
    if node.strategy == "share":
        free = [f"{gpu}-{n}" for gpu in range(node.gpus) for n in range(used[gpu] * node.units, node.ids)]
        size, wanted = LAST_UNITS, (f"{pods % node.gpus}-",)
    else:
        uuids = [fake_uuid(gpu) for gpu in range(node.gpus)]
        free = [f"{uuids[gpu]}-{n}" for gpu in range(node.gpus) for n in range(used[gpu], node.split)]
        size, wanted = 2, tuple(f"{uuids[(pods + k) % node.gpus]}-" for k in range(2))
    asked = pb.ContainerPreferredAllocationRequest(available_deviceIDs=free, allocation_size=size)
    return 0, pb.PreferredAllocationRequest(container_requests=[asked]), wanted


def measure(api: Connection, sockets: Sequence[Path], args: argparse.Namespace, node: Node, pods: int) -> Run:
    deadline = time.monotonic() + 60
    while not all(socket.exists() for socket in sockets) and time.monotonic() < deadline:
        time.sleep(0.05)
    window, pace_s = args.window, args.pace_ms / 1000
    with contextlib.ExitStack() as stack:
        channels = [stack.enter_context(grpc.insecure_channel(f"unix://{socket}")) for socket in sockets]
        plugins = [deviceplugin_grpc.DevicePluginStub(channel) for channel in channels]
        for plugin in plugins:
            plugin.GetDevicePluginOptions(pb.Empty(), timeout=30)
        time.sleep(2)  # the daemon's start-up work done
        # Each window starts with the same pods pending: its first batch and the last pod.
        ask(api, "create", 0, ADMITTED)
        time.sleep(1)
        started = time.time()
        fresh, fresh_empty = paced(plugins, api, node, 0, window, pace_s=pace_s)
        fresh_ended = time.time()
        fill: dict[int, list[float]] = collections.defaultdict(list)
        for first in range(window, args.allocations, FILL_CHUNK):
            count = min(FILL_CHUNK, args.allocations - first)
            ask(api, "create", first, count)
            for r, took in back_to_back(plugins, node, first, count).items():
                fill[r] += took
        settle(api, args.allocations)
        ask(api, "create", args.allocations, ADMITTED)
        time.sleep(1)
        after_started = time.time()
        after, after_empty = paced(plugins, api, node, args.allocations, window, pace_s=pace_s)
        ended = time.time()
        # Kubelet offers every free ID; the daemon should pick the pending pod's GPU(s).
        r, preferred_asked, wanted = preferred_request(node, pods)
        preferred = []
        for _ in range(20):
            began = time.perf_counter()
            answer = plugins[r].GetPreferredAllocation(preferred_asked, timeout=10)
            preferred.append((time.perf_counter() - began) * 1000)
        (chosen,) = answer.container_responses
        steered = len(chosen.deviceIDs) > 0 and all(d.startswith(wanted) for d in chosen.deviceIDs)
    api_calls: collections.Counter[str] = collections.Counter()
    for since, until in ((started, fresh_ended), (after_started, ended)):
        api.send(("requests", since, until))
        api_calls += api.recv()
    names = [resource.name for resource in node.resources]
    return Run(
        fresh={names[r]: percentiles(took)[:2] for r, took in fresh.items()},
        after={names[r]: percentiles(took)[:2] for r, took in after.items()},
        floor=percentiles(fresh_empty + after_empty)[:2],
        fill={
            names[r]: (statistics.median(t[:window]), statistics.median(t[-window:])) for r, t in fill.items()
        },
        api=api_calls,
        preferred_ms=statistics.median(preferred),
        steered=steered,
    )


@dataclass(frozen=True)
class Figures:
    """The medians over the runs of one synchronous level, for one resource."""

    fresh50: float
    fresh99: float
    after50: float
    after99: float
    floor50: float
    floor99: float

    @classmethod
    def of(cls, runs: Sequence[Run], resource: str) -> Figures:
        def median(pick: Callable[[Run], float]) -> float:
            return statistics.median(pick(run) for run in runs)

        return cls(
            median(lambda r: r.fresh[resource][0]),
            median(lambda r: r.fresh[resource][1]),
            median(lambda r: r.after[resource][0]),
            median(lambda r: r.after[resource][1]),
            median(lambda r: r.floor[0]),
            median(lambda r: r.floor[1]),
        )


def label(node: Node, resource: str) -> str:
    """What a row's metric starts with: nothing on a share node (one resource), else the resource."""
    return "" if node.strategy == "share" else f"{resource.removeprefix('volcano.sh/')} "


def summary(
    runs: Sequence[Run], args: argparse.Namespace, node: Node, level: str
) -> tuple[dict[str, Figures], int]:
    """Print one level's figures; returns them by resource and the synchronous API calls seen."""
    n = f"{args.allocations:,}"
    print(
        f"\n{node.strategy} node, synchronous={level}: median of {len(runs)} run(s); {args.window} pods per "
        f"window, each Allocate paced {args.pace_ms:g} ms apart; {node.gpus} GPUs of {node.ids} IDs, "
        f"{node.units} a pod"
    )
    figures = {}
    for resource in node.resources:
        name = resource.name
        figures[name] = got = Figures.of(runs, name)
        fill_first = statistics.median(r.fill[name][0] for r in runs)
        fill_last = statistics.median(r.fill[name][1] for r in runs)
        print(f"{name}:")
        print(f"  Allocate, fresh node      p50 {got.fresh50:6.3f} ms  p99 {got.fresh99:6.3f} ms")
        print(f"  Allocate, {n} live   p50 {got.after50:6.3f} ms  p99 {got.after99:6.3f} ms")
        print(
            f"  unpaced fill: p50 {fill_first:.3f} ms over its first {args.window}, "
            f"{fill_last:.3f} ms its last"
        )
    floor = next(iter(figures.values()))
    print(f"empty RPC, paced alike    p50 {floor.floor50:6.3f} ms  p99 {floor.floor99:6.3f} ms")
    preferred = statistics.median(r.preferred_ms for r in runs)
    print(
        f"GetPreferredAllocation for the pending pod from every free ID: p50 {preferred:.1f} ms "
        f"({'on' if all(r.steered for r in runs) else 'NOT on'} the scheduled GPU)"
    )
    by_method = sum((r.api for r in runs), collections.Counter())
    reads = sum(count for method, count in by_method.items() if method != "PATCH")
    print(f"API requests during the measured Allocates: {dict(by_method) or 'none'} (synchronous: {reads})")
    return figures, reads


def report(results: dict[str, Sequence[Run]], args: argparse.Namespace, node: Node) -> int:
    n = f"{args.allocations:,}"
    rows, reads = [], 0
    for level, runs in results.items():
        by_resource, level_reads = summary(runs, args, node, level)
        reads += level_reads
        for resource, figures in by_resource.items():
            rows += level_rows(label(node, resource), n, level, figures)
    print()
    record(rows)
    return 0 if reads == 0 else 1


def level_rows(what: str, n: str, level: str, figures: Figures) -> list[Row]:
    """The issue's rows for one resource's Allocate (`what` starts the metric) at one level."""
    if level != PRODUCT_SYNC:  # a reference: what the setting the product does not use costs
        return [
            Row(
                f"{what}Allocate p50, {n} live, synchronous={level} (not used; docs/ledger.md)",
                figures.after50,
                "ms",
                figures.floor50,
                "reference (floor: paced empty RPC p50)",
                True,
            )
        ]
    return [
        Row(
            f"{what}Allocate p50, fresh node",
            figures.fresh50,
            "ms",
            figures.floor50,
            "ratio <= 2",
            figures.fresh50 <= 2 * figures.floor50,
        ),
        Row(
            f"{what}Allocate p50, {n} live / fresh node",
            figures.after50,
            "ms",
            figures.fresh50,
            "ratio <= 1.3",
            figures.after50 <= 1.3 * figures.fresh50,
        ),
        Row(
            f"{what}Allocate p50, {n} live",
            figures.after50,
            "ms",
            figures.floor50,
            "ratio <= 2 (floor: paced empty RPC p50)",
            figures.after50 <= 2 * figures.floor50,
        ),
        Row(
            f"{what}Allocate p99, {n} live",
            figures.after99,
            "ms",
            figures.floor99,
            "ratio <= 3 (floor: paced empty RPC p99)",
            figures.after99 <= 3 * figures.floor99,
        ),
    ]


if __name__ == "__main__":
    sys.exit(main())
