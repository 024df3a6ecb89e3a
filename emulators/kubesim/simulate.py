"""`deviceplugin simulate`: the whole flow end to end on one machine (`make demo`).

Starts a simulated cluster (`sim.cluster`: API server, GPU nodes each with its kubelet and the real
daemon on fake GPUs of its own, the extenders and the simulated scheduler), schedules the documented
scenarios through it (or the workloads of `--scenario FILE`, on the nodes of `--nodes` or of the
file), checks what every container received against what the scheduler wrote and the pod asked
(`verify`), and prints pods, containers, GPUs, env vars, gangs, a metrics excerpt and where each
ledger lives, or one JSON document (`--output json`, docs/simulate.md). Exits 1 when anything did not
behave, 2 when the scenario or the nodes cannot be simulated (the reason on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deviceplugin.fit import keys
from kubesim import report
from kubesim.ascend import CORE, COUNT, MEMORY, VNPU_MODE, AscendNodeSpec
from kubesim.cluster import SimCluster
from kubesim.failures import SimulationError
from kubesim.nodes import DEFAULT_NODES, DEMO_NODES, MIG_NODE, NodeSpec, NodeSpecError, parse_node_options
from kubesim.report import PodReport
from kubesim.scenario import Scenario, read_scenario
from kubesim.scratch import LONGEST_CLUSTER_ROOT, scratch_dir
from kubesim.signals import Stopped, stop_raises, stop_signals
from kubesim.workloads import ScenarioError

METRICS_SHOWN = ("volcano_vgpu_device_allocated_memory", "volcano_vgpu_device_shared_number")

Check = Callable[[Sequence[PodReport]], None]  # adds to a report's problems what the scenario promised


def _pod(
    name: str, limits: dict[str, str], namespace: str = "demo", mode: str | None = None
) -> dict[str, Any]:
    """A one-container pod; `mode`: its `volcano.sh/vgpu-mode` (the vGPU nodes it fits)."""
    annotations = {"annotations": {keys.VGPU_MODE: mode}} if mode else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, **annotations},
        "spec": {"containers": [{"name": "cuda", "image": "nvidia/cuda", "resources": {"limits": limits}}]},
    }


def _npu_pod(name: str, limits: dict[str, str], hami_core: bool = False) -> dict[str, Any]:
    pod = _pod(name, limits)
    if hami_core:
        pod["metadata"]["annotations"] = {VNPU_MODE: "hami-core"}
    pod["spec"]["containers"][0] |= {"name": "npu", "image": "ascend-toolkit"}
    return pod


def _one_gpu(reports: Sequence[PodReport]) -> None:
    """The pods share one GPU (what verify does not know to expect)."""
    gpus = {report.gpu_indices(view) for report in reports for view in report.containers}
    if len(gpus) != 1:
        for report in reports:
            report.problems.append(f"{report.key}: the 1024 MiB pods did not share one GPU ({sorted(gpus)})")


@dataclass(frozen=True)
class Play:
    scenario: Scenario
    check: Check | None = None
    #: Print the containers' mounts too (where they are what the mode gives, as MPS's pipe and shm).
    mounts: bool = False


DEMO = (
    Play(
        Scenario(
            "GPU sharing: two pods of 1024 MiB share one GPU",
            (_pod("share-a", {keys.GPU_MEMORY: "1024"}), _pod("share-b", {keys.GPU_MEMORY: "1024"})),
        ),
        _one_gpu,
    ),
    Play(Scenario("GPU number: a pod takes two whole GPUs", (_pod("whole-pair", {keys.GPU_NUMBER: "2"}),))),
    Play(
        Scenario(
            "Whole GPUs: a pod asks NVIDIA's nvidia.com/gpu: 2 and gets an NVLink pair of the whole node "
            "(docs/whole.md: this project's daemon in place of NVIDIA's device plugin)",
            (_pod("nvidia-pair", {keys.NVIDIA_GPU: "2"}),),
        )
    ),
    Play(
        Scenario(
            "vGPU: a job of three workers, 1 vGPU and 1024 MiB each (vgpu-mode hami-core: HAMi-core limits)",
            tuple(
                _pod(
                    f"job-worker-{n}",
                    {keys.VGPU_NUMBER: "1", keys.VGPU_MEMORY: "1024"},
                    mode=keys.MODE_HAMI_CORE,
                )
                for n in range(3)
            ),
        )
    ),
    Play(
        Scenario(
            "vGPU in MIG mode: a pod of 1 vGPU and 9000 MiB (vgpu-mode mig) on the H100 in MIG mode gets "
            "slot group1-0, a 1g.10gb MIG device of its own (the card partitioned at Allocate)",
            (
                _pod(
                    "mig-worker",
                    {keys.VGPU_NUMBER: "1", keys.VGPU_MEMORY: str(9000 // MIG_NODE.memory_factor)},
                    mode=keys.MODE_MIG,
                ),
            ),
        )
    ),
    Play(
        Scenario(
            "vGPU in MPS mode: a pod of 1 vGPU, 4096 MiB and 30% of the cores (vgpu-mode mps) on the A10 "
            "shares it through the GPU's MPS control daemon, held to its limits by MPS (no HAMi-core)",
            (
                _pod(
                    "mps-worker",
                    {keys.VGPU_NUMBER: "1", keys.VGPU_MEMORY: "4096", keys.VGPU_CORES: "30"},
                    mode=keys.MODE_MPS,
                ),
            ),
        ),
        mounts=True,
    ),
    Play(
        Scenario(
            "Ascend 310P vNPUs: a template pod (4096 MiB -> vir02) and a hami-core pod (8192 MiB, 50% of "
            "the AI cores), bound through the extender with HAMi's annotations",
            (
                _npu_pod("npu-template", {COUNT: "1", MEMORY: "4096"}),
                _npu_pod("npu-hami-core", {COUNT: "1", MEMORY: "8192", CORE: "50"}, hami_core=True),
            ),
        )
    ),
)
#: The demo's Ascend node (HAMi's Ascend device plugin publishes it; no daemon of this project runs).
DEMO_ASCEND = (AscendNodeSpec("npu-ascend-1"),)


# --- output -------------------------------------------------------------------------------------


def print_metrics(cluster: SimCluster) -> None:
    for node in cluster.nodes.values():
        with urllib.request.urlopen(node.metrics_url() + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        lines = [line for line in text.splitlines() if line.startswith(METRICS_SHOWN)]
        print(f"{node.spec.name} ({node.spec.strategy}) {node.metrics_url()}/metrics:")
        for line in lines:
            print(f"  {line}")


# --- main ---------------------------------------------------------------------------------------


def play(cluster: SimCluster, plays: Sequence[Play], text: bool) -> list[PodReport]:
    """Run every scenario in order; each pod's report."""
    reports: list[PodReport] = []
    for each in plays:
        scenario = each.scenario
        placements = cluster.play(scenario.pods, scenario.gangs)
        cluster.settle(placements)
        played = [report.inspect(cluster, placement) for placement in placements]
        if each.check is not None:
            each.check(played)
        if text:
            print(f"\n== {scenario.title}")
            report.print_pods(played)
            if each.mounts:
                report.print_mounts(played)
            report.print_npu_annotations(played)
            report.print_gangs(scenario.gangs, played)
            for line in scenario.not_simulated:
                print(f"  not simulated: {line}")
        reports += played
    return reports


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "simulate",
        help="run the whole flow end to end on this machine and print the outcome",
        description="Start an API server, simulated GPU nodes (kubelet emulator + the real daemon with fake "
        "GPUs), the scheduler extenders and a scheduler, then schedule the documented scenarios (or your "
        "own workloads) and check what every container received.",
    )
    parser.add_argument(
        "--scenario",
        type=Path,
        metavar="FILE",
        help="YAML of Pods, Deployments, ReplicaSets, Volcano Jobs and PodGroups (and optionally Volcano's "
        "scheduler ConfigMap and a nodes: section) to schedule instead of the demo",
    )
    parser.add_argument(
        "--nodes",
        action="append",
        metavar="SPEC",
        help="a simulated node as key=value pairs (strategy=vgpu,count=4,model=A100,memory=40960,name=a,"
        "mode=hami-core), or a YAML file with a nodes: list; repeat for more nodes. Replaces the demo "
        "cluster and a scenario's nodes: section",
    )
    parser.add_argument(
        "--output", "-o", choices=("text", "json"), default="text", help="text tables, or one JSON document"
    )
    parser.add_argument(
        "--keep-running", action="store_true", help="leave the cluster up (kubeconfig printed) until Ctrl-C"
    )


def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        plays = (Play(read_scenario(args.scenario)),) if args.scenario else DEMO
        nodes = _nodes(args.nodes, plays)
    except (ScenarioError, NodeSpecError) as err:
        print(f"deviceplugin simulate: {err}", file=sys.stderr)
        return 2
    # Sockets, ledgers and logs go to a temporary directory removed on every way out: the first
    # SIGTERM or Ctrl-C unwinds through the same clean-up (nodes stopped, files removed) as a return.
    try:
        with stop_raises(), scratch_dir("dpsim-", LONGEST_CLUSTER_ROOT) as directory:
            return _simulate(args, plays, nodes, directory, started)
    except Stopped as stopped:
        print(f"deviceplugin simulate: stopped by {stopped}", file=sys.stderr)
        return 128 + stopped.signum


def _nodes(given: Sequence[str] | None, plays: Sequence[Play]) -> tuple[NodeSpec, ...]:
    """`--nodes`, else the scenario's nodes: section, else the demo cluster (a scenario's: no MIG node)."""
    if given:
        return parse_node_options(given)
    default = DEMO_NODES if plays is DEMO else DEFAULT_NODES
    return next((p.scenario.nodes for p in plays if p.scenario.nodes is not None), default)


def _simulate(
    args: argparse.Namespace,
    plays: Sequence[Play],
    nodes: Sequence[NodeSpec],
    directory: Path,
    started: float,
) -> int:
    text = args.output == "text"
    say: Callable[[str], None] = print if text else lambda line: print(line, file=sys.stderr)
    first = plays[0].scenario
    ascend = DEMO_ASCEND if plays is DEMO else ()
    cluster = SimCluster(
        directory,
        nodes,
        policy=first.policy or "binpack",
        weight=first.weight or 1,
        ascend_nodes=ascend,
        gpu_aware=first.gpu_aware,
    )
    reports: list[PodReport] = []
    error = None
    try:
        npus = f", {len(ascend)} Ascend node" if ascend else ""
        say(f"starting: API server, {len(nodes)} GPU nodes{npus}, extenders (files in {directory})")
        try:
            cluster.start()
            if text:
                report.print_nodes(cluster)
            reports = play(cluster, plays, text)
            if text:
                print("\n== metrics (excerpt)")
                print_metrics(cluster)
        except SimulationError as err:
            error = str(err)
        ok = _outcome(
            plays, nodes, reports, error=error, took=time.monotonic() - started, text=text, ascend=ascend
        )
        if args.keep_running and error is None:
            _keep_running(cluster, say)
        return 0 if ok else 1
    finally:
        cluster.stop()


def _outcome(
    plays: Sequence[Play],
    nodes: Sequence[NodeSpec],
    reports: Sequence[PodReport],
    *,
    error: str | None,
    took: float,
    text: bool,
    ascend: Sequence[AscendNodeSpec] = (),
) -> bool:
    """Print the summary line, or the JSON document; whether everything behaved."""
    gangs = [gang for p in plays for gang in p.scenario.gangs]
    notes = [line for p in plays for line in p.scenario.not_simulated]
    outcome = report.document(reports, nodes, gangs, notes, error, ascend=ascend)
    if not text:
        print(json.dumps(outcome, indent=2))
    elif error is not None:
        print(f"BAD: {error}")
    elif bad := sum(len(r.problems) for r in reports):
        print(f"\n{bad} problem(s) ({took:.1f} s)")
    else:
        print(f"\nevery step behaved as documented ({took:.1f} s)")
    return bool(outcome["ok"])


def _keep_running(cluster: SimCluster, say: Callable[[str], None]) -> None:
    with stop_signals() as wait:  # before saying so: a Ctrl-C right after the line is a clean stop
        say(f"\nthe cluster is up: kubectl --kubeconfig {cluster.kubeconfig} get pods -A")
        say(f"                  deviceplugin inspect --kubeconfig {cluster.kubeconfig}")
        say("Ctrl-C stops it.")
        wait()
