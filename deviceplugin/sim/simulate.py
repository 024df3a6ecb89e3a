"""`deviceplugin simulate`: the whole flow end to end on one machine (`make demo`).

Starts a simulated cluster (`sim.cluster`: API server, three GPU nodes, one per strategy, each with
its kubelet and the real daemon, and the extenders), schedules the documented scenarios through it
(or the pods of `--scenario FILE`), checks what every container got, and prints pods, nodes, GPUs,
env vars, a metrics excerpt and where each ledger lives. Exits 1 when any step did not behave.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deviceplugin.fit import keys
from deviceplugin.sim.cluster import NodeSpec, Placement, SimCluster, SimulationError
from deviceplugin.sim.scratch import scratch_dir
from deviceplugin.sim.signals import Stopped, stop_raises, stop_signals

NODES = (
    NodeSpec("gpu-share-1", "share", "2x10989"),
    NodeSpec("gpu-number-1", "number", "4x16384"),
    NodeSpec("gpu-vgpu-1", "vgpu", "2x16384"),
)
ENV_SHOWN = (
    "NVIDIA_VISIBLE_DEVICES",
    "VOLCANO_GPU_ALLOCATED",
    "VOLCANO_GPU_TOTAL",
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_SM_LIMIT",
)
METRICS_SHOWN = ("volcano_vgpu_device_allocated_memory", "volcano_vgpu_device_shared_number")

Check = Callable[[Sequence[Placement]], list[str]]  # what went wrong, empty when all is well


def _pod(name: str, limits: dict[str, str], namespace: str = "demo") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "cuda", "image": "nvidia/cuda", "resources": {"limits": limits}}]},
    }


def _envs(placement: Placement) -> dict[str, str]:
    """Every env var the container got, merged over its resources as kubelet does."""
    envs: dict[str, str] = {}
    if placement.admission is not None:
        for allocation in placement.admission.allocations:
            envs |= dict(allocation.envs)
    return envs


def _sharing(placements: Sequence[Placement]) -> list[str]:
    wrong = [
        f"{p.name}: VOLCANO_GPU_ALLOCATED is not 1024"
        for p in placements
        if _envs(p).get("VOLCANO_GPU_ALLOCATED") != "1024"
    ]
    if len({_envs(p).get("NVIDIA_VISIBLE_DEVICES") for p in placements}) != 1:
        wrong.append("the two 1024 MiB pods did not share one GPU")
    wrong += [
        f"{p.name}: not marked gpu-assigned"
        for p in placements
        if p.annotations.get(keys.GPU_ASSIGNED) != "true"
    ]
    return wrong


def _number(placements: Sequence[Placement]) -> list[str]:
    (placement,) = placements
    visible = _envs(placement).get("NVIDIA_VISIBLE_DEVICES", "").split(",")
    return (
        [] if len(set(visible)) == 2 and all(visible) else [f"{placement.name}: got GPUs {visible}, wanted 2"]
    )


def _vgpu_job(placements: Sequence[Placement]) -> list[str]:
    wrong = []
    for placement in placements:
        envs = _envs(placement)
        if envs.get("CUDA_DEVICE_MEMORY_LIMIT_0") != "1024m" or not envs.get("NVIDIA_VISIBLE_DEVICES"):
            wrong.append(f"{placement.name}: no 1024m memory limit on its GPU")
        if placement.annotations.get(keys.BIND_PHASE) != keys.BIND_PHASE_SUCCESS:
            wrong.append(f"{placement.name}: bind-phase is {placement.annotations.get(keys.BIND_PHASE)!r}")
    return wrong


@dataclass(frozen=True)
class Scenario:
    title: str
    pods: tuple[dict[str, Any], ...]
    check: Check


SCENARIOS = (
    Scenario(
        "GPU sharing: two pods of 1024 MiB share one GPU",
        (_pod("share-a", {keys.GPU_MEMORY: "1024"}), _pod("share-b", {keys.GPU_MEMORY: "1024"})),
        _sharing,
    ),
    Scenario(
        "GPU number: a pod takes two whole GPUs", (_pod("whole-pair", {keys.GPU_NUMBER: "2"}),), _number
    ),
    Scenario(
        "vGPU: a job of three workers, 1 vGPU and 1024 MiB each (HAMi-core limits)",
        tuple(_pod(f"job-worker-{n}", {keys.VGPU_NUMBER: "1", keys.VGPU_MEMORY: "1024"}) for n in range(3)),
        _vgpu_job,
    ),
)


def _admitted(placements: Sequence[Placement]) -> list[str]:
    """A user's scenario: every pod placed and admitted."""
    return [f"{p.namespace}/{p.name}: {p.problem}" for p in placements if p.problem]


def read_scenario(path: Path) -> Scenario:
    """Pods from a YAML file (one or more documents; `kind: List` accepted)."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as err:
        raise SimulationError(f"--scenario {path}: {err}") from None
    pods: list[dict[str, Any]] = []
    for document in documents:
        items = (
            document.get("items")
            if isinstance(document, dict) and document.get("kind") == "List"
            else [document]
        )
        for item in items or []:
            if (
                not isinstance(item, dict)
                or item.get("kind") != "Pod"
                or not (item.get("metadata") or {}).get("name")
            ):
                raise SimulationError(
                    f"--scenario {path}: every document must be a named Pod (or a List of them)"
                )
            pods.append(item)
    if not pods:
        raise SimulationError(f"--scenario {path}: no pods in the file")
    return Scenario(f"scenario {path.name}", tuple(pods), _admitted)


# --- output -------------------------------------------------------------------------------------


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _gpus(placement: Placement) -> str:
    """The scheduler's gpu-index, or (vGPU) the start of each GPU UUID."""
    if keys.GPU_INDEX in placement.annotations:
        return placement.annotations[keys.GPU_INDEX]
    visible = _envs(placement).get("NVIDIA_VISIBLE_DEVICES", "")
    return ",".join(uuid[:12] for uuid in visible.split(",")) if visible else "-"


def print_placements(placements: Sequence[Placement]) -> None:
    rows = [["POD", "NODE", "GPU", "STATUS", "ENV (as the container sees it)"]]
    for placement in placements:
        envs = _envs(placement)
        shown = " ".join(f"{k}={envs[k]}" for k in ENV_SHOWN if k in envs)
        status = "Running" if placement.admission and placement.admission.admitted else "FAILED"
        rows.append(
            [
                f"{placement.namespace}/{placement.name}",
                placement.node or "-",
                _gpus(placement),
                status,
                shown,
            ]
        )
    print(_table(rows))
    for placement in placements:
        if placement.problem:
            print(f"  ! {placement.namespace}/{placement.name}: {placement.problem}")


def print_metrics(cluster: SimCluster) -> None:
    for node in cluster.nodes.values():
        with urllib.request.urlopen(node.metrics_url() + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        lines = [line for line in text.splitlines() if line.startswith(METRICS_SHOWN)]
        print(f"{node.spec.name} ({node.spec.strategy}) {node.metrics_url()}/metrics:")
        for line in lines:
            print(f"  {line}")


def print_nodes(cluster: SimCluster) -> None:
    rows = [["NODE", "STRATEGY", "FAKE GPUS", "LEDGER"]]
    rows += [[n.spec.name, n.spec.strategy, n.spec.fake_gpus, str(n.ledger)] for n in cluster.nodes.values()]
    print(_table(rows))


# --- main ---------------------------------------------------------------------------------------


def play(cluster: SimCluster, scenarios: Sequence[Scenario]) -> list[str]:
    """Schedule every scenario's pods in order; what went wrong, per scenario."""
    problems = []
    for scenario in scenarios:
        print(f"\n== {scenario.title}")
        placements = [cluster.schedule(cluster.submit(pod)) for pod in scenario.pods]
        cluster.settle(placements)
        print_placements(placements)
        wrong = scenario.check(placements)
        for line in wrong:
            print(f"  BAD: {line}")
        problems += wrong
    return problems


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "simulate",
        help="run the whole flow end to end on this machine and print the outcome",
        description="Start an API server, three simulated GPU nodes (kubelet emulator + the real daemon with "
        "fake GPUs) and the scheduler extender, then schedule the documented scenarios (or your own pods).",
    )
    parser.add_argument("--scenario", type=Path, metavar="FILE", help="YAML file of Pods to schedule instead")
    parser.add_argument(
        "--keep-running", action="store_true", help="leave the cluster up (kubeconfig printed) until Ctrl-C"
    )


def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        scenarios = (read_scenario(args.scenario),) if args.scenario else SCENARIOS
    except SimulationError as err:
        print(f"deviceplugin simulate: {err}")
        return 2
    # Sockets, ledgers and logs go to a temporary directory removed on every way out: the first
    # SIGTERM or Ctrl-C unwinds through the same clean-up (nodes stopped, files removed) as a return.
    try:
        with stop_raises(), scratch_dir("dpsim-") as directory:
            return _simulate(args, scenarios, directory, started)
    except Stopped as stopped:
        print(f"deviceplugin simulate: stopped by {stopped}", file=sys.stderr)
        return 128 + stopped.signum


def _simulate(
    args: argparse.Namespace, scenarios: Sequence[Scenario], directory: Path, started: float
) -> int:
    cluster = SimCluster(directory, NODES)
    try:
        print(f"starting: API server, {len(NODES)} GPU nodes, extenders (files in {directory})")
        cluster.start()
        print_nodes(cluster)
        problems = play(cluster, scenarios)
        print("\n== metrics (excerpt)")
        print_metrics(cluster)
        if args.keep_running:
            _keep_running(cluster)
    except SimulationError as err:
        print(f"BAD: {err}")
        return 1
    finally:
        cluster.stop()
    took = time.monotonic() - started
    if problems:
        print(f"\n{len(problems)} step(s) did not behave ({took:.1f} s)")
        return 1
    print(f"\nevery step behaved as documented ({took:.1f} s)")
    return 0


def _keep_running(cluster: SimCluster) -> None:
    print(f"\nthe cluster is up: kubectl --kubeconfig {cluster.kubeconfig} get pods -A")
    print(f"                  deviceplugin inspect --kubeconfig {cluster.kubeconfig}")
    print("Ctrl-C stops it.")
    with stop_signals() as wait:
        wait()
