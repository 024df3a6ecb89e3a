"""What the gpu-aware node score leaves free, against binpack alone, after one mixed workload.

Cluster: `--nodes` nodes of 8 GPUs (80 GiB H100s, vgpu strategy), each publishing two 4-card
NVLink islands (GPUs 0-3 and 4-7, NV4 inside, SYS between) in `volcano.sh/gpu-topology`,
held by the API-server emulator in this process. The extender is the real product
(`Extender`: caches listing and watching the emulator, the inventory, its HTTP server).

Workload (`workload`): whole-GPU pods of 1, 2 and 4 GPUs and shares of one GPU (8-32 GiB), in an
order drawn from the seed, about 60% of the cluster's GPUs. Each pod goes through
kube-scheduler's nodeCacheCapable exchange over HTTP: POST /filter with every node's name, POST
/prioritize with those that passed, POST /bind to the best score (ties drawn at random from a
per-pod seed, as kube-scheduler picks among equal nodes; the extender's is the only score). A pod
that no node passes, or whose bind fails, stays pending.

Then, from the extender's own inventory: whole idle GPUs, idle 4-GPU NVLink islands, nodes whose
8 GPUs are all idle (able to take an 8-GPU pod), and the pods not placed. The floor is the same
workload on a fresh cluster and a fresh extender with binpack alone (gpu-aware off); gpu-aware
runs with the weights `docs/gpu-aware.md` recommends. Each figure is the median over `--seeds`.

Run: `.venv/bin/python bench/fragmentation.py [--nodes 16] [--seeds 3] [--weight W --loss-weight L]`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import operator
import random
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from report import Row, record

from deviceplugin.extender import Extender, ExtenderConfig
from deviceplugin.fit import GpuState, encode_node_register
from deviceplugin.fit.topology import TOPOLOGY_KEY, Link, Topology
from deviceplugin.kube.api import Kube, load_client
from kubesim.apiserver import ApiServerEmulator

GPUS = 8
ISLAND = 4  # cards per NVLink island
GPU_MEMORY = 81920  # MiB
NODES = 16
SEEDS = 3
WEIGHT = 0.0  # docs/gpu-aware.md's recommended setting
LOSS_WEIGHT = 2.0
NAMESPACE = "bench"
SHARE_MEMORY = (8192, 16384, 24576, 32768)
# Per 16 nodes (128 GPUs): (pods, GPUs each; 0 = a share of one GPU)
MIX = ((24, 1), (10, 2), (6, 4), (32, 0))
LOAD = 1.0  # multiple of MIX: 1.0 asks 62% of the GPUs (shares at their average), 1.5 93%

Obj = dict[str, Any]


def _link(a: int, b: int) -> Link:
    return Link("NV", 4) if a // ISLAND == b // ISLAND else Link("SYS")


TOPOLOGY = Topology.build(range(GPUS), [gpu // ISLAND for gpu in range(GPUS)], _link)


def node(n: int) -> Obj:
    name = f"gpu-node-{n:03d}"
    gpus = [
        GpuState(index=i, uuid=f"GPU-{n:08x}-0000-4000-8000-{i:012x}", type="NVIDIA-H100", memory=GPU_MEMORY)
        for i in range(GPUS)
    ]
    resources = {
        "volcano.sh/vgpu-number": str(GPUS * 10),
        "volcano.sh/vgpu-memory": str(GPUS * GPU_MEMORY),
        "volcano.sh/vgpu-cores": str(GPUS * 100),
    }
    return {
        "metadata": {
            "name": name,
            "labels": {"volcano.sh/gpu-strategy": "vgpu"},
            "annotations": {
                "volcano.sh/node-vgpu-register": encode_node_register(gpus),
                TOPOLOGY_KEY: TOPOLOGY.encode(),
            },
        },
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def workload(seed: int, nodes: int, load: float = LOAD) -> list[Obj]:
    """The pods, in the seed's order; the mix scaled to the cluster's size."""
    rng = random.Random(seed)
    shapes: list[dict[str, str]] = []
    for count, gpus in MIX:
        for _ in range(max(1, round(count * load * nodes / NODES))):
            if gpus:
                shapes.append({"volcano.sh/vgpu-number": str(gpus)})
            else:
                memory = rng.choice(SHARE_MEMORY)
                shapes.append({"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": str(memory)})
    rng.shuffle(shapes)
    return [
        {
            "metadata": {"name": f"pod-{i:04d}", "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]},
        }
        for i, limits in enumerate(shapes)
    ]


class Client:
    """kube-scheduler's side of the extender protocol over one keep-alive connection."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def post(self, verb: str, body: object) -> Any:
        self.connection.request(
            "POST", f"/{verb}", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        response = self.connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{verb}: HTTP {response.status}: {data[:200]!r}")
        return json.loads(data)


@dataclass(frozen=True)
class Outcome:
    whole_gpus: int  # idle healthy GPUs
    islands: int  # idle 4-GPU NVLink islands
    full_nodes: int  # nodes whose 8 GPUs are idle
    unplaced: int  # pods no node took


def place(api: ApiServerEmulator, client: Client, pods: list[Obj], names: list[str], seed: int) -> int:
    """Schedule every pod in order as kube-scheduler would; the number left pending."""
    unplaced = 0
    for i, pod in enumerate(pods):
        created = api.create("pods", pod)
        passed = client.post("filter", {"Pod": created, "NodeNames": names}).get("NodeNames") or []
        if not passed:
            unplaced += 1
            continue
        scores = client.post("prioritize", {"Pod": created, "NodeNames": passed})
        top = max(entry["Score"] for entry in scores)
        best = [entry["Host"] for entry in scores if entry["Score"] == top]
        chosen = random.Random(seed * 100_000 + i).choice(best)
        meta = created["metadata"]
        binding = {"PodName": meta["name"], "PodNamespace": NAMESPACE, "PodUID": meta["uid"], "Node": chosen}
        if client.post("bind", binding).get("Error"):
            unplaced += 1
    return unplaced


def run(seed: int, nodes: int, load: float, config: ExtenderConfig, work: Path) -> Outcome:
    """The workload on a fresh cluster and a fresh extender."""
    with ApiServerEmulator() as api:
        api.create("namespaces", {"metadata": {"name": NAMESPACE}})
        for n in range(nodes):
            api.create("nodes", node(n))
        kube = Kube(load_client(api.write_kubeconfig(work / f"kubeconfig-{seed}")))
        extender = Extender(config, kube, address="127.0.0.1:0").start(60)
        try:
            names = extender.inventory.node_names()
            unplaced = place(api, Client(extender.http.port), workload(seed, nodes, load), names, seed)
            views = [extender.inventory.view(name) for name in names]
            idle = [[card.health and not card.pods for card in view.gpus] for view in views if view]
        finally:
            extender.stop()
    return Outcome(
        whole_gpus=sum(sum(cards) for cards in idle),
        islands=sum(all(cards[i : i + ISLAND]) for cards in idle for i in range(0, GPUS, ISLAND)),
        full_nodes=sum(all(cards) for cards in idle),
        unplaced=unplaced,
    )


def median(outcomes: list[Outcome], field: str) -> float:
    return float(statistics.median(getattr(outcome, field) for outcome in outcomes))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--seeds", type=int, default=SEEDS)
    parser.add_argument("--weight", type=float, default=WEIGHT)
    parser.add_argument("--loss-weight", type=float, default=LOSS_WEIGHT)
    parser.add_argument("--load", type=float, default=LOAD, help="multiple of the workload's mix")
    args = parser.parse_args()
    base = ExtenderConfig(strategy="vgpu", policy="binpack", log_level="warning")
    aware = ExtenderConfig(
        strategy="vgpu",
        policy="binpack",
        log_level="warning",
        gpu_aware_weight=args.weight,
        gpu_aware_loss_weight=args.loss_weight,
    )
    binpack: list[Outcome] = []
    gpu_aware: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="fragbench") as work:
        for seed in range(1, args.seeds + 1):
            binpack.append(run(seed, args.nodes, args.load, base, Path(work)))
            gpu_aware.append(run(seed, args.nodes, args.load, aware, Path(work)))
            print(f"seed {seed}: binpack {binpack[-1]}\n        gpu-aware {gpu_aware[-1]}", flush=True)
    pods = len(workload(1, args.nodes, args.load))
    size = f"{args.nodes} x {GPUS}-GPU nodes, {pods} pods, median of {args.seeds} orders"
    rows = []
    meets = {"> binpack": operator.gt, ">= binpack": operator.ge, "<= binpack": operator.le}
    for field, what, unit, better in (
        # Every pod placed, the idle GPUs are what the workload leaves whoever places it (only
        # how shares are packed could differ): the gain is in the shape of what is left.
        ("whole_gpus", "whole idle GPUs left", "GPUs", ">= binpack"),
        ("islands", "idle 4-GPU NVLink islands left", "islands", "> binpack"),
        ("full_nodes", "nodes able to take an 8-GPU pod", "nodes", "> binpack"),
        ("unplaced", "pods not placed", "pods", "<= binpack"),
    ):
        value, floor = median(gpu_aware, field), median(binpack, field)
        passed = bool(meets[better](value, floor))
        rows.append(Row(f"{what}, gpu-aware vs binpack ({size})", value, unit, floor, better, passed))
    record(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
