"""Daemon memory: RSS with 500 pods on the node, per additional cached pod, per allocation released.

Targets (issue 15 item 4): RSS <= 110 MB with 500 pods on the node; <= 1.5 KB per additional
cached pod; no growth per allocation once its rows are released. The daemon runs as in a
deployment (share mode, 8 fake 80 GB GPUs with --gpu-memory-factor=auto, the kubelet emulator, the
API-server emulator over HTTP). Pods look like a Deployment's pods as a real API server serves them
(managedFields, owner references, labels, a container with image, command, env, probes and a
mounted service-account volume, tolerations, a running status with conditions and container
statuses), scheduled by Volcano onto a GPU and served (`gpu-assigned: "true"`).

Each run (median of `--runs`, 3 by default), on daemons of its own: (1) the same-run baseline, a
daemon with no pod on the node, then allocation cycles on it: each binds `--cycle` pending GPU pods,
sends one Allocate per pod to the plugin's socket, waits until their patches are applied, deletes
the pods and waits until the ledger has released every row. The first `--warmup` cycles (12,000
allocations) fill what is bounded but kept past a release: the outbox's 10,000 UIDs of deleted
pods, whose table grows once more, by about a megabyte of RSS, at the 10,923rd deleted pod (where
its dict resizes; never again after: an 80-cycle run stays flat past it), and SQLite's page cache
over the released rows it retains for a day. Growth = the
least-squares slope of RSS over the `--cycles` measured cycles, per allocation (one RSS reading
jumps by a megabyte now and then as the allocator maps a new arena; the slope is what stays).
(2) A daemon started with 500 pods on the node: RSS once its cache has listed them; then 4,500
more are bound (watch events) and RSS is read again once the daemon has served a pod bound after
them: (RSS at 5,000 - RSS at 500) / 4,500 per additional pod.
Run: `.venv/bin/python bench/memory.py [--runs N] [--warmup N] [--cycles N] [--cycle PODS]`.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from common import api_access_volume, daemon_command
from report import Row, record

from deviceplugin.api import deviceplugin_grpc
from deviceplugin.api import deviceplugin_pb2 as pb
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator

NODE = "bench"
GPUS = 8
UNITS = 25  # kubelet devices per pod (100 MiB at the factor of 4 that auto picks for 80 GB GPUs)
RSS_TARGET_MB = 110.0
PER_POD_TARGET_KB = 1.5
PER_ALLOCATION_TARGET_KB = 0.1  # "no growth": below what one allocation's smallest record would take
FIRST, MORE = 500, 4_500
SETTLE_S = 1.0  # after the awaited condition, for background threads to finish their round


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def deployment_pod(name: str, gpu: int, *, assigned: bool) -> dict[str, Any]:
    """A pod as a ReplicaSet creates it and Volcano binds it to a GPU (`assigned`: already served)."""
    labels = {"app": "inference", "pod-template-hash": "7d9c6b5f4d", "volcano.sh/queue-name": "default"}
    annotations = {"volcano.sh/gpu-index": str(gpu), "volcano.sh/predicate-time": str(time.time_ns())}
    if assigned:
        annotations["volcano.sh/gpu-assigned"] = "true"
    env: list[dict[str, Any]] = [
        {"name": f"SETTING_{n}", "value": f"value-{n}-" + "x" * 24} for n in range(6)
    ]
    env.append(
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}
    )
    fields: dict[str, Any] = {"f:metadata": {"f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}}}}
    fields["f:spec"] = {
        "f:containers": {'k:{"name":"server"}': {f"f:{k}": {} for k in ("image", "env", "ports")}}
    }
    return {
        "metadata": {
            "name": name,
            "generateName": name.rsplit("-", 1)[0] + "-",
            "namespace": "bench",
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "inference-7d9c6b5f4d",
                    "uid": "0b7c9f52-8f43-4d55-9a38-4c1f3f0e8a11",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-25T10:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": fields,
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-25T10:00:05Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:podIP": {}}},
                    "subresource": "status",
                },
            ],
        },
        "spec": {
            "nodeName": NODE,
            "schedulerName": "volcano",
            "serviceAccountName": "default",
            "containers": [
                {
                    "name": "server",
                    "image": "registry.example.com/ml/inference-server:2.14.1-cuda12.4",
                    "command": ["/usr/local/bin/serve"],
                    "args": ["--port=8080", "--model-dir=/models", "--max-batch=16"],
                    "env": env,
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "resources": {
                        "limits": {"cpu": "2", "memory": "8Gi", "volcano.sh/gpu-memory": str(UNITS)},
                        "requests": {"cpu": "1", "memory": "4Gi", "volcano.sh/gpu-memory": str(UNITS)},
                    },
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 10},
                    "volumeMounts": [
                        {
                            "name": "kube-api-access-x7k2p",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                            "readOnly": True,
                        }
                    ],
                }
            ],
            "volumes": [api_access_volume("kube-api-access-x7k2p")],
            "tolerations": [
                {
                    "key": f"node.kubernetes.io/{taint}",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
                for taint in ("not-ready", "unreachable")
            ],
        },
    }


def running_status(name: str) -> dict[str, Any]:
    conditions = [
        {"type": kind, "status": "True", "lastTransitionTime": "2026-11-25T10:00:05Z"}
        for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    return {
        "status": {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": "10.0.3.17",
            "podIP": "10.244.3.91",
            "startTime": "2026-11-25T10:00:01Z",
            "containerStatuses": [
                {
                    "name": "server",
                    "state": {"running": {"startedAt": "2026-11-25T10:00:04Z"}},
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.example.com/ml/inference-server:2.14.1-cuda12.4",
                    "imageID": "registry.example.com/ml/inference-server@sha256:" + "3f" * 32,
                    "containerID": f"containerd://{name.encode().hex():0>64}"[:77],
                    "started": True,
                }
            ],
        }
    }


def bind_pods(apiserver: ApiServerEmulator, prefix: str, count: int, *, assigned: bool) -> list[str]:
    names = []
    for n in range(count):
        name = f"{prefix}-{n:05d}"
        apiserver.create("pods", deployment_pod(name, n % GPUS, assigned=assigned))
        if assigned:
            apiserver.patch("pods", name, running_status(name), "bench", subresource="status")
        names.append(name)
    return names


class Daemon:
    """The daemon under test, its plugin socket and its metrics."""

    def __init__(self, work: Path, kubeconfig: Path) -> None:
        self.port = free_port()
        extra = ["--kubeconfig", str(kubeconfig), "--gpu-memory-factor", "auto", "--log-level", "warning"]
        extra += ["--metrics-address", f"127.0.0.1:{self.port}", "--allocate-timeout", "60"]
        extra += ["--pod-resources-socket", str(work / "none.sock")]  # releases come from the watch
        self.process = subprocess.Popen(daemon_command(work, NODE, f"{GPUS}x81920", extra))
        self.socket = work / "dp" / "volcano.sock"
        wait(self.ready, "the daemon to be ready")
        self.channel = grpc.insecure_channel(f"unix://{self.socket}")
        self.plugin = deviceplugin_grpc.DevicePluginStub(self.channel)

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as answer:
                return answer.status, answer.read().decode()
        except OSError as err:
            return getattr(err, "code", 0), ""

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"the daemon exited with {self.process.returncode}")
        return self._get("/readyz")[0] == 200

    def metric(self, name: str) -> float:
        for line in self._get("/metrics")[1].splitlines():
            if line.startswith(f"volcano_gpu_plugin_{name} "):
                return float(line.split()[1])
        raise RuntimeError(f"no metric {name}")

    def allocate(self, gpu: int, first_id: int) -> None:
        ids = [f"{gpu}-{first_id + k}" for k in range(UNITS)]
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
        self.plugin.Allocate(request, timeout=90)

    def rss_mb(self) -> float:
        time.sleep(SETTLE_S)
        return rss_mb(self.process.pid)

    def stop(self) -> None:
        self.channel.close()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)


@contextmanager
def daemon(work: Path, kubeconfig: Path) -> Iterator[Daemon]:
    with KubeletEmulator(work / "dp"):
        running = Daemon(work, kubeconfig)
        try:
            yield running
        finally:
            running.stop()


def allocation_cycle(apiserver: ApiServerEmulator, running: Daemon, cycle: int, pods: int) -> None:
    names = bind_pods(apiserver, f"cycle{cycle}", pods, assigned=False)
    for n in range(len(names)):
        running.allocate(n % GPUS, (n // GPUS) * UNITS)
    wait(lambda: running.metric("outbox_backlog") == 0, "the outbox to apply the patches")
    for name in names:
        apiserver.delete("pods", name, "bench")
    wait(lambda: running.metric("ledger_allocations") == 0, "the ledger to release every row")


@dataclass(frozen=True)
class Run:
    baseline_mb: float  # no pod on the node
    at_first_mb: float  # FIRST pods listed at start
    per_pod_kb: float  # per pod cached past FIRST
    per_allocation_kb: float  # RSS slope over the measured cycles, per allocation released


def measure(apiserver: ApiServerEmulator, kubeconfig: Path, work: Path, args: argparse.Namespace) -> Run:
    with daemon(work / "a", kubeconfig) as running:
        baseline = running.rss_mb()
        for cycle in range(args.warmup):
            allocation_cycle(apiserver, running, cycle, args.cycle)
        samples = []
        for cycle in range(args.warmup, args.warmup + args.cycles + 1):
            allocation_cycle(apiserver, running, cycle, args.cycle)
            samples.append(running.rss_mb())
    allocations = [n * args.cycle for n in range(len(samples))]
    slope_mb = statistics.linear_regression(allocations, samples).slope
    names = bind_pods(apiserver, f"first{work.name}", FIRST, assigned=True)
    with daemon(work / "b", kubeconfig) as running:
        at_first = running.rss_mb()
        names += bind_pods(apiserver, f"more{work.name}", MORE, assigned=True)
        names += bind_pods(apiserver, f"last{work.name}", 1, assigned=False)
        running.allocate(0, 0)  # answered once the cache holds the pod bound last
        at_more = running.rss_mb()
    for name in names:  # the next run starts from an empty node
        apiserver.delete("pods", name, "bench")
    cycled = f"after {args.warmup + 1} cycles {samples[0]:.1f} MB, {args.cycles} more {samples[-1]:.1f} MB"
    cached = f"{FIRST} pods {at_first:.1f} MB, {FIRST + MORE:,} {at_more:.1f} MB"
    print(f"no pods {baseline:.1f} MB; {cycled}; {cached}")
    return Run(baseline, at_first, (at_more - at_first) * 1024 / MORE, slope_mb * 1024)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs, each on new daemons; rows are medians")
    parser.add_argument("--warmup", type=int, default=60, help="allocation cycles before the measured ones")
    parser.add_argument("--cycles", type=int, default=20, help="measured allocation cycles")
    parser.add_argument("--cycle", type=int, default=200, help="pods allocated and released per cycle")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dpmem", dir="/tmp"))
    runs = []
    try:
        with ApiServerEmulator() as apiserver:
            apiserver.create("nodes", {"metadata": {"name": NODE}})
            apiserver.create("namespaces", {"metadata": {"name": "bench"}})
            kubeconfig = apiserver.write_kubeconfig(work / "kubeconfig")
            runs = [measure(apiserver, kubeconfig, work / f"r{n}", args) for n in range(args.runs)]
    finally:
        shutil.rmtree(work)

    def median(field: str) -> float:
        return float(statistics.median(getattr(run, field) for run in runs))

    baseline, at_first = median("baseline_mb"), median("at_first_mb")
    per_pod_kb, per_allocation_kb = median("per_pod_kb"), median("per_allocation_kb")
    allocations = args.cycles * args.cycle
    rows = [
        Row(
            f"daemon RSS, {FIRST} pods on the node",
            at_first,
            "MB",
            baseline,
            f"<= {RSS_TARGET_MB:g} MB (floor: no pods)",
            at_first <= RSS_TARGET_MB,
        ),
        Row(
            f"daemon RSS per cached pod, {FIRST} -> {FIRST + MORE:,}",
            per_pod_kb,
            "KB/pod",
            None,
            f"<= {PER_POD_TARGET_KB:g} KB",
            per_pod_kb <= PER_POD_TARGET_KB,
        ),
        Row(
            f"daemon RSS growth per released allocation (slope over {allocations:,})",
            per_allocation_kb,
            "KB",
            None,
            f"<= {PER_ALLOCATION_TARGET_KB:g} KB (no growth)",
            per_allocation_kb <= PER_ALLOCATION_TARGET_KB,
        ),
    ]
    record(rows)
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
