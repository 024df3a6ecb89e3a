"""Scheduling-cycle latency and memory of the extender, each against its floor in the same run.

Cluster: N nodes of 8 GPUs with 4 running GPU pods each (random cards and sizes, one unhealthy GPU
on every tenth node), as full API objects of a real cluster's size (labels, owner references,
managed fields, env, volumes, container statuses; nodes with images, conditions and node info),
held by the API-server emulator in this process. The extender is the real product in a child
process (`Extender`: node and pod caches listing and watching the emulator over HTTP, the
inventory, the HTTP server), so its RSS is its own: RSS per node = (RSS once both caches synced
- RSS before they listed) / N, after a collection, transient list buffers included.

Cycle: kube-scheduler's nodeCacheCapable exchange over one keep-alive connection: POST /filter
with every node's name, then POST /prioritize with the names that passed; each cycle a new pending
pod (share: 2-16 GiB of gpu-memory; vgpu: one vGPU of 2-16 GiB and 20 cores; four shapes in turn).
The request bodies are built beforehand; the client only sends bytes and reads the reply bytes.
The timed pass follows the recording pass, so each shape's quick scores are kept on every node
(the steady state of a queue of a few job shapes on nodes that do not change); `--profile` shows
the first cycle's cost too (a new shape: the quick fit on every node), and the table prints it as
`new shape ms` (not a target: the recording pass's first cycle, measured once per run).

Floor: the same HTTP server (deviceplugin.httpserver, the extender's limits) in another child
process, answering each request of the same byte stream by decoding its JSON body and encoding the
reply the extender gave to that request (recorded in a first pass) with the extender's encoder:
HTTP + JSON of the same bytes, both ways. Real and floor cycles alternate, so load on the machine
hits both alike. Replies are checked byte for byte against the recorded ones.

Topology (issue 17): `--topology` gives every node a published `volcano.sh/gpu-topology` (two
NVLink islands of 4: NV4 inside, SYS between, one NUMA node each); `--gpu-aware` runs the
extender with the gpu-aware score on (`loss.weight` 2, docs/gpu-aware.md); `--multi-gpu` makes
the pending pods multi-GPU so the topology picks cards (number: `gpu-number` 4, 2, 4, 3 in turn
on nodes running four 1-GPU pods on distinct cards; vgpu: `vgpu-number` 2 of the four memory sizes).
`--strategies number,vgpu --multi-gpu` then with `--topology`, then with `--gpu-aware` too, gives
the cycle with topology scoring off and on.

Targets (issue 15 item 1): 500 nodes: cycle p50 <= 3x the floor's; 5,000 nodes: p99 <= 50 ms;
20,000 nodes: p99 <= 150 ms and <= 3x the floor's p99; RSS <= 8 KB per node with its pods (a row
at the largest size from 5,000 nodes: below, the caches' fixed costs dominate the quotient). Each
figure is the median of `--runs` runs (fresh extender and floor processes each run).
Run: `.venv/bin/python bench/extender.py` (500 nodes; the issue's table: `--sizes 500,5000,20000`;
`--cycles`, `--runs`, `--strategies`);
`--profile` prints a cProfile of the extender's handler (filter + prioritize, in-process) instead.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import http.client
import json
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import api_access_volume, percentiles
from report import Row, record

from deviceplugin.fit import GpuState, encode_node_register
from deviceplugin.fit.keys import Strategy
from deviceplugin.fit.topology import TOPOLOGY_KEY, Topology, parse_link
from kubesim.apiserver import ApiServerEmulator

GPUS = 8
GPU_MEMORY = 81559  # MiB of an H100 80GB
PODS_PER_NODE = 4
SIZES = (500,)  # quick by default; the issue's table: --sizes 500,5000,20000
PENDING_MEMORY = (8192, 4096, 16384, 2048)  # pod shapes in turn, as a queue of several jobs holds
PENDING_GPUS = (4, 2, 4, 3)  # --multi-gpu: a number pod's GPUs in turn
PENDING_VGPUS = 2  # --multi-gpu: a vgpu pod's vGPUs
GPU_AWARE_LOSS_WEIGHT = 2.0  # --gpu-aware: docs/gpu-aware.md's recommended setting
STRATEGIES: tuple[Strategy, ...] = ("share", "vgpu")
BENCH_STRATEGIES: tuple[Strategy, ...] = ("share", "number", "vgpu")
NAMESPACE = "bench"
FLOOR_RATIO = 3.0
P99_5K_MS = 50.0
P99_20K_MS = 150.0
KB_PER_NODE = 8.0
MEMORY_MIN_NODES = 5000  # RSS per node is a target from this size on (fixed costs spread thin enough)

Obj = dict[str, Any]
#: --topology: two NVLink islands of 4 GPUs, as the annotation publishes them.
ISLANDS = Topology.build(
    range(GPUS),
    [gpu // 4 for gpu in range(GPUS)],
    lambda a, b: parse_link("NV4" if a // 4 == b // 4 else "SYS"),
).encode()


@dataclass(frozen=True)
class Setup:
    """What the nodes publish, what the extender scores and what the pending pods ask."""

    topology: bool = False
    gpu_aware: bool = False
    multi_gpu: bool = False

    def flags(self) -> list[str]:
        return [
            f"--{name.replace('_', '-')}"
            for name in ("topology", "gpu_aware", "multi_gpu")
            if getattr(self, name)
        ]

    def label(self) -> str:
        parts = [name for name in ("topology", "gpu-aware") if getattr(self, name.replace("-", "_"))]
        return ("multi-GPU pods, " if self.multi_gpu else "") + (" + ".join(parts) or "no topology")


# ------------------------------------------------------------------------------ the cluster


def _uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-0000-4000-8000-{gpu:012x}"


def node_name(n: int) -> str:
    return f"gpu-node-{n:05d}.cluster.local"


def _images(n: int) -> list[Obj]:
    return [
        {
            "names": [
                f"registry.example.com/team-{i % 7}/image-{i}@sha256:{(n * 31 + i) % 10**12:064x}",
                f"registry.example.com/team-{i % 7}/image-{i}:v1.{i}.{n % 9}",
            ],
            "sizeBytes": 100_000_000 + i * 7_654_321,
        }
        for i in range(20)
    ]


def make_node(strategy: Strategy, n: int, topology: bool = False) -> Obj:
    name = node_name(n)
    sick = (3,) if n % 10 == 0 else ()
    if strategy == "vgpu":
        gpus = [
            GpuState(index=i, uuid=_uuid(n, i), type="NVIDIA-H100", memory=GPU_MEMORY, health=i not in sick)
            for i in range(GPUS)
        ]
        gpu_resources = {
            "volcano.sh/vgpu-number": str(GPUS * 10),
            "volcano.sh/vgpu-memory": str(GPUS * GPU_MEMORY),
            "volcano.sh/vgpu-cores": str(GPUS * 100),
        }
        gpu_notes = {"volcano.sh/node-vgpu-register": encode_node_register(gpus)}
    else:
        gpu_resources = {"volcano.sh/gpu-memory": str(GPUS * GPU_MEMORY), "volcano.sh/gpu-number": str(GPUS)}
        gpu_notes = {"volcano.sh/gpu-unhealthy-ids": ",".join(map(str, sick))} if sick else {}
    if topology:
        gpu_notes[TOPOLOGY_KEY] = ISLANDS
    resources = {
        "cpu": "224",
        "ephemeral-storage": "3750000000Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": "2113301516Ki",
        "pods": "110",
        **gpu_resources,
    }
    when = "2025-01-01T00:00:00Z"
    return {
        "metadata": {
            "name": name,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "topology.kubernetes.io/region": "eu-west-1",
                "topology.kubernetes.io/zone": f"eu-west-1{'abc'[n % 3]}",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": str(GPUS),
                "volcano.sh/gpu-strategy": strategy,
                "pool": f"pool-{n % 40}",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": f"i-{n:017x}"}),
                **gpu_notes,
            },
        },
        "spec": {
            "providerID": f"aws:///eu-west-1a/i-{n:017x}",
            "podCIDR": f"10.{n // 256 % 256}.{n % 256}.0/24",
        },
        "status": {
            "capacity": resources,
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": kind,
                    "status": "True" if kind == "Ready" else "False",
                    "lastHeartbeatTime": when,
                    "lastTransitionTime": when,
                    "reason": f"Kubelet{kind}",
                    "message": f"kubelet reports {kind}",
                }
                for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
            ],
            "addresses": [
                {"type": "InternalIP", "address": f"10.1.{n // 256 % 256}.{n % 256}"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": f"{n:032x}",
                "systemUUID": f"ec2{n:029x}",
                "bootID": f"{n * 7:032x}",
                "kernelVersion": "5.10.219-208.866.amzn2.x86_64",
                "osImage": "Amazon Linux 2",
                "containerRuntimeVersion": "containerd://1.7.11",
                "kubeletVersion": "v1.29.3",
                "kubeProxyVersion": "v1.29.3",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": _images(n),
        },
    }


def _container(name: str, limits: dict[str, str]) -> Obj:
    return {
        "name": name,
        "image": "registry.example.com/ml/trainer:2024.11.3",
        "command": ["python", "-m", "trainer"],
        "args": ["--config", "/etc/trainer/config.yaml", "--epochs", "40"],
        "env": [
            {"name": "NCCL_DEBUG", "value": "WARN"},
            {"name": "OMP_NUM_THREADS", "value": "8"},
            {
                "name": "POD_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
            },
            {"name": "MODEL_BUCKET", "value": "s3://models-eu/trainer"},
        ],
        "ports": [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}],
        "resources": {
            "limits": {"cpu": "8", "memory": "64Gi", **limits},
            "requests": {"cpu": "4", "memory": "32Gi"},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/trainer", "readOnly": True},
            {
                "name": "kube-api-access",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            },
        ],
    }


def _pod(strategy: Strategy, name: str, limits: dict[str, str], annotations: dict[str, str]) -> Obj:
    return {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app": "trainer", "team": "ml", "pod-template-hash": "7d9f8c6b5d"},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9400", **annotations},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "trainer-7d9f8c6b5d",
                    "uid": "6f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "schedulerName": "volcano",
            "serviceAccountName": "trainer",
            "containers": [_container("main", limits)],
            "volumes": [
                {"name": "config", "configMap": {"name": "trainer-config", "defaultMode": 420}},
                api_access_volume(),
            ],
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
        },
    }


def running_pod(strategy: Strategy, n: int, rng: random.Random, nodes: int) -> Obj:
    node, gpu = n // PODS_PER_NODE % nodes, rng.randrange(GPUS)
    memory = rng.choice([2048, 4096, 8192, 16384])
    if strategy == "number":  # four 1-GPU pods on distinct cards of the node
        gpu = random.Random(node).sample(range(GPUS), PODS_PER_NODE)[n % PODS_PER_NODE]
        limits = {"volcano.sh/gpu-number": "1"}
        annotations = {"volcano.sh/gpu-index": str(gpu), "volcano.sh/predicate-time": str(1_700_000_000 + n)}
    elif strategy == "vgpu":
        cores = rng.choice([0, 10, 20])
        limits = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": str(memory)}
        annotations = {"volcano.sh/vgpu-ids-new": f"{_uuid(node, gpu)},NVIDIA,{memory},{cores}:"}
    else:
        limits = {"volcano.sh/gpu-memory": str(memory)}
        annotations = {"volcano.sh/gpu-index": str(gpu), "volcano.sh/predicate-time": str(1_700_000_000 + n)}
    pod = _pod(strategy, f"run-{n}", limits, annotations)
    pod["spec"]["nodeName"] = node_name(node)
    when = "2025-01-01T00:00:00Z"
    ip = f"10.{node // 256 % 256}.{node % 256}.{10 + n % PODS_PER_NODE}"
    pod["status"] = {
        "phase": "Running",
        "conditions": [
            {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": when}
            for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "hostIP": f"10.1.{node // 256 % 256}.{node % 256}",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": when,
        "containerStatuses": [
            {
                "name": "main",
                "state": {"running": {"startedAt": when}},
                "ready": True,
                "restartCount": 0,
                "image": "registry.example.com/ml/trainer:2024.11.3",
                "imageID": f"registry.example.com/ml/trainer@sha256:{n:064x}",
                "containerID": f"containerd://{n * 13:064x}",
                "started": True,
            }
        ],
        "qosClass": "Burstable",
    }
    return pod


def pending_pod(strategy: Strategy, n: int, multi_gpu: bool = False) -> Obj:
    memory = str(PENDING_MEMORY[n % len(PENDING_MEMORY)])
    if strategy == "number":
        limits = {"volcano.sh/gpu-number": str(PENDING_GPUS[n % len(PENDING_GPUS)] if multi_gpu else 1)}
    elif strategy == "vgpu":
        limits = {
            "volcano.sh/vgpu-number": str(PENDING_VGPUS if multi_gpu else 1),
            "volcano.sh/vgpu-memory": memory,
            "volcano.sh/vgpu-cores": "20",
        }
    else:
        limits = {"volcano.sh/gpu-memory": memory}
    pod = _pod(strategy, f"new-{n}", limits, {})
    pod["metadata"]["uid"] = f"0000{n:04x}-new0-4000-8000-000000000000"
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    return pod


def fill(api: ApiServerEmulator, strategy: Strategy, nodes: int, topology: bool = False) -> None:
    rng = random.Random(11)
    api.create("namespaces", {"metadata": {"name": NAMESPACE}})
    for n in range(nodes):
        api.create("nodes", make_node(strategy, n, topology))
    for n in range(nodes * PODS_PER_NODE):
        api.create("pods", running_pod(strategy, n, rng, nodes))


# ------------------------------------------------------------------------------ the children


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def serve_extender(strategy: Strategy, kubeconfig: str, profile_cycles: int, setup: Setup) -> None:
    """Child: the extender on a free port; prints its port and RSS, serves until stdin closes."""
    from deviceplugin.extender.app import Extender, settle  # noqa: PLC0415
    from deviceplugin.extender.config import ExtenderConfig  # noqa: PLC0415
    from deviceplugin.memory import return_large_buffers_to_the_os  # noqa: PLC0415

    config = ExtenderConfig(
        strategy=strategy,
        policy="binpack",
        kubeconfig=Path(kubeconfig),
        log_level="warning",
        gpu_aware_loss_weight=GPU_AWARE_LOSS_WEIGHT if setup.gpu_aware else 0.0,
    )
    return_large_buffers_to_the_os()  # as `deviceplugin extender` does
    extender = Extender(config, address="127.0.0.1:0")
    gc.collect()
    empty_kb = _rss_kb()
    began = time.perf_counter()
    extender.start(sync_timeout_s=600)
    if not extender.synced():
        raise RuntimeError("the extender's caches did not sync")
    sync_s = time.perf_counter() - began
    settle()  # as `deviceplugin extender` does once its caches sync
    filled_kb = _rss_kb()
    if profile_cycles:
        _profile(extender, strategy, profile_cycles, setup.multi_gpu)
        extender.stop()
        return
    print(
        json.dumps(
            {"port": extender.http.port, "empty_kb": empty_kb, "filled_kb": filled_kb, "sync_s": sync_s}
        )
    )
    sys.stdout.flush()
    sys.stdin.read()
    extender.stop()


def _profile(extender: Any, strategy: Strategy, cycles: int, multi_gpu: bool) -> None:
    """cProfile of filter + prioritize through the extender's HTTP handler, in this thread."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from deviceplugin.extender.http import ExtenderHandler  # noqa: PLC0415
    from deviceplugin.httpserver import Request  # noqa: PLC0415

    handler = ExtenderHandler(extender.service, CollectorRegistry())
    names = extender.inventory.node_names()

    def cycle(n: int) -> None:
        pod = pending_pod(strategy, n, multi_gpu)
        body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
        reply = json.loads(handler(Request("POST", "/filter", "HTTP/1.1", {}, body)).body)
        body = json.dumps({"Pod": pod, "NodeNames": reply["NodeNames"]}).encode()
        handler(Request("POST", "/prioritize", "HTTP/1.1", {}, body))

    cycle(-1)
    profiler = cProfile.Profile()
    profiler.enable()
    for n in range(cycles):
        cycle(n)
    profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(25)


def serve_floor(replies_file: str) -> None:
    """Child: the extender's HTTP stack answering each request with the reply the extender gave it,
    decoded from JSON at start and encoded again per request, after decoding the request's body."""
    from deviceplugin.extender.config import ExtenderConfig  # noqa: PLC0415
    from deviceplugin.extender.http import error_response, json_response, limits_for, request_body  # noqa: PLC0415
    from deviceplugin.httpserver import HttpServer, Request, Response  # noqa: PLC0415

    canned: dict[tuple[str, str], object] = {}
    with open(replies_file, encoding="utf-8") as lines:
        for line in lines:
            verb, uid, reply = json.loads(line)
            canned[verb, uid] = json.loads(reply)

    def handler(request: Request) -> Response:
        body = request_body(request.body)
        assert isinstance(body, dict)
        return json_response(200, canned[request.path.rsplit("/", 1)[-1], body["Pod"]["metadata"]["uid"]])

    server = HttpServer(
        ("127.0.0.1", 0), handler, limits_for(ExtenderConfig()), name="floor", errors=error_response
    )
    server.start()
    print(json.dumps({"port": server.server_address[1]}))
    sys.stdout.flush()
    sys.stdin.read()
    server.stop()


@contextlib.contextmanager
def child(*args: str) -> Iterator[dict[str, Any]]:
    """Run this script in `args`' child mode; yields the JSON line it prints once serving."""
    process = subprocess.Popen(
        [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdin is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"child {args[0]} exited with {process.wait()} before serving")
        yield json.loads(line)
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ------------------------------------------------------------------------------ the client


def exchange(connection: http.client.HTTPConnection, path: str, body: bytes) -> bytes:
    connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    payload = response.read()
    if response.status != 200:
        raise RuntimeError(f"{path}: HTTP {response.status}: {payload[:200]!r}")
    return payload


@dataclass(frozen=True)
class Exchange:
    """One cycle's requests and the extender's replies to them."""

    filter_body: bytes
    filter_reply: bytes
    prioritize_body: bytes
    prioritize_reply: bytes
    recorded_ms: float  # the recording cycle's time: the first of a pod shape fits every node anew


def record_cycles(
    connection: http.client.HTTPConnection, strategy: Strategy, names: list[str], cycles: int, multi_gpu: bool
) -> list[Exchange]:
    """The first pass: each pod's filter and prioritize, the replies kept for the floor."""
    recorded = []
    for n in range(cycles):
        pod = pending_pod(strategy, n, multi_gpu)
        filter_body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
        began = time.perf_counter()
        filter_reply = exchange(connection, "/filter", filter_body)
        result = json.loads(filter_reply)
        if result["Error"] or not result["NodeNames"]:
            raise RuntimeError(f"filter: {result['Error'] or 'no node fits'}")
        prioritize_body = json.dumps({"Pod": pod, "NodeNames": result["NodeNames"]}).encode()
        prioritize_reply = exchange(connection, "/prioritize", prioritize_body)
        took_ms = (time.perf_counter() - began) * 1000
        recorded.append(Exchange(filter_body, filter_reply, prioritize_body, prioritize_reply, took_ms))
    return recorded


def timed_cycle(connection: http.client.HTTPConnection, cycle: Exchange) -> float:
    began = time.perf_counter()
    filtered = exchange(connection, "/filter", cycle.filter_body)
    prioritized = exchange(connection, "/prioritize", cycle.prioritize_body)
    took_ms = (time.perf_counter() - began) * 1000
    if (filtered, prioritized) != (cycle.filter_reply, cycle.prioritize_reply):
        raise RuntimeError("a reply differs from the one recorded for the same request")
    return took_ms


@dataclass(frozen=True)
class Run:
    p50: float
    p99: float
    floor_p50: float
    floor_p99: float
    kb_per_node: float
    sync_s: float
    passed: int
    new_shape_ms: float  # the first cycle of the run: a pod shape the extender has not seen


def measure(
    strategy: Strategy, nodes: int, kubeconfig: Path, cycles: int, work: Path, *, setup: Setup
) -> Run:
    with child("--serve-extender", strategy, str(kubeconfig), *setup.flags()) as extender:
        connection = http.client.HTTPConnection("127.0.0.1", extender["port"], timeout=120)
        names = [node_name(n) for n in range(nodes)]
        recorded = record_cycles(connection, strategy, names, cycles, setup.multi_gpu)
        replies = work / "replies.jsonl"
        with replies.open("w", encoding="utf-8") as out:
            for n, cycle in enumerate(recorded):
                uid = pending_pod(strategy, n)["metadata"]["uid"]
                out.write(json.dumps(["filter", uid, cycle.filter_reply.decode()]) + "\n")
                out.write(json.dumps(["prioritize", uid, cycle.prioritize_reply.decode()]) + "\n")
        with child("--serve-floor", str(replies)) as floor:
            floor_connection = http.client.HTTPConnection("127.0.0.1", floor["port"], timeout=120)
            for cycle in recorded[:3]:  # warm-up of the floor
                timed_cycle(floor_connection, cycle)
            real, canned = [], []
            for cycle in recorded:
                real.append(timed_cycle(connection, cycle))
                canned.append(timed_cycle(floor_connection, cycle))
            floor_connection.close()
        connection.close()
    p50, p99, _ = percentiles(real)
    floor_p50, floor_p99, _ = percentiles(canned)
    kb_per_node = (extender["filled_kb"] - extender["empty_kb"]) / nodes
    passed = len(json.loads(recorded[0].filter_reply)["NodeNames"])
    return Run(
        p50, p99, floor_p50, floor_p99, kb_per_node, extender["sync_s"], passed, recorded[0].recorded_ms
    )


def median_run(runs: Sequence[Run]) -> Run:
    fields = Run.__dataclass_fields__
    return Run(**{name: statistics.median(getattr(run, name) for run in runs) for name in fields})


def rows_for(strategy: Strategy, nodes: int, run: Run, setup: Setup) -> list[Row]:
    what = f"extender filter+prioritize, {nodes:,} nodes, {strategy}"
    if setup != Setup():
        what += f", {setup.label()}"
    if nodes <= 500:
        return [
            Row(
                f"{what}, p50",
                run.p50,
                "ms",
                run.floor_p50,
                "<= 3x floor",
                run.p50 <= FLOOR_RATIO * run.floor_p50,
            )
        ]
    if nodes <= 5000:
        return [
            Row(f"{what}, p99", run.p99, "ms", run.floor_p99, f"<= {P99_5K_MS:.0f} ms", run.p99 <= P99_5K_MS)
        ]
    ok = run.p99 <= P99_20K_MS and run.p99 <= FLOOR_RATIO * run.floor_p99
    return [Row(f"{what}, p99", run.p99, "ms", run.floor_p99, f"<= {P99_20K_MS:.0f} ms, <= 3x floor", ok)]


def memory_row(strategy: Strategy, nodes: int, run: Run) -> Row:
    what = f"extender RSS per node with its {PODS_PER_NODE} pods, {nodes:,} nodes, {strategy}"
    return Row(what, run.kb_per_node, "KB", None, f"<= {KB_PER_NODE:.0f} KB", run.kb_per_node <= KB_PER_NODE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="node counts, comma-separated")
    parser.add_argument(
        "--strategies", default=",".join(STRATEGIES), help=f"of {', '.join(BENCH_STRATEGIES)}"
    )
    parser.add_argument(
        "--topology", action="store_true", help="every node publishes two NVLink islands of 4"
    )
    parser.add_argument("--gpu-aware", action="store_true", help="the gpu-aware score on (loss.weight 2)")
    parser.add_argument(
        "--multi-gpu", action="store_true", help="multi-GPU pending pods (gpu-number 4, vgpu-number 2)"
    )
    parser.add_argument("--cycles", type=int, default=40, help="timed cycles per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per size; each figure is their median")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="CYCLES", help="profile this many cycles instead"
    )
    parser.add_argument(
        "--serve-extender", nargs=2, metavar=("STRATEGY", "KUBECONFIG"), help=argparse.SUPPRESS
    )
    parser.add_argument("--serve-floor", metavar="REPLIES", help=argparse.SUPPRESS)
    args = parser.parse_args()
    setup = Setup(topology=args.topology, gpu_aware=args.gpu_aware, multi_gpu=args.multi_gpu)
    if args.serve_extender:
        serve_extender(args.serve_extender[0], args.serve_extender[1], args.profile, setup)
        return 0
    if args.serve_floor:
        serve_floor(args.serve_floor)
        return 0
    sizes = [int(size) for size in args.sizes.split(",")]
    strategies: list[Strategy] = args.strategies.split(",")
    unknown = sorted(set(strategies) - set(BENCH_STRATEGIES))
    if unknown:
        parser.error(f"--strategies: {', '.join(unknown)} not one of {', '.join(BENCH_STRATEGIES)}")
    print(
        f"extender scheduling cycle: {GPUS} GPUs and {PODS_PER_NODE} running pods per node, NodeNames, "
        f"policy binpack, {setup.label()}, {args.cycles} cycles x {args.runs} runs; "
        "floor: the same HTTP stack and JSON"
    )
    print(
        f"{'nodes':>6} {'strategy':8} {'p50 ms':>8} {'p99 ms':>8} {'floor p50':>9} {'floor p99':>9} "
        f"{'KB/node':>8} {'sync s':>7} {'new shape ms':>12}"
    )
    rows: list[Row] = []
    memory: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="dpbench") as tmp:
        work = Path(tmp)
        for nodes in sizes:
            for strategy in strategies:
                with ApiServerEmulator(bookmark_interval_s=30.0) as api:
                    fill(api, strategy, nodes, setup.topology)
                    kubeconfig = api.write_kubeconfig(work / "kubeconfig")
                    if args.profile:
                        subprocess.run(
                            [
                                sys.executable,
                                __file__,
                                "--serve-extender",
                                strategy,
                                str(kubeconfig),
                                "--profile",
                                str(args.profile),
                                *setup.flags(),
                            ],
                            check=True,
                        )
                        continue
                    runs = [
                        measure(strategy, nodes, kubeconfig, args.cycles, work, setup=setup)
                        for _ in range(args.runs)
                    ]
                run = median_run(runs)
                print(
                    f"{nodes:>6} {strategy:8} {run.p50:8.1f} {run.p99:8.1f} "
                    f"{run.floor_p50:9.2f} {run.floor_p99:9.2f} {run.kb_per_node:8.1f} {run.sync_s:7.1f}"
                    f" {run.new_shape_ms:12.1f}   ({run.passed} nodes fit)",
                    flush=True,
                )
                rows += rows_for(strategy, nodes, run, setup)
                if nodes == max(sizes) and nodes >= MEMORY_MIN_NODES:
                    memory.append(memory_row(strategy, nodes, run))
    if args.profile:
        return 0
    record(rows + memory)
    return 0 if all(row.passed for row in rows + memory) else 1


if __name__ == "__main__":
    raise SystemExit(main())
