"""What `simulate` reports: per pod where it went, what each container received and what is wrong,
as text tables or as one JSON document (`--output json`, documented in docs/simulate.md).

The JSON document's keys are stable:

    {"ok": bool, "error": null | text,
     "pods": [{"namespace", "name", "node" (null when not bound), "phase", "problem" (null or text),
               "annotations": {...}, "containers": [{"name", "env": {...},
               "mounts": [{"container_path", "host_path", "read_only"}]}]}],
     "nodes": [{"name", "strategy", "mode" (vGPU sharing mode or null), "memory_factor" (MiB per
                memory unit), "gpus": [{"index", "uuid", "model", "memory" (MiB)}]}],
     "gangs": [{"namespace", "name", "source", "min_member", "pods": [...], "scheduled": bool}],
     "not_simulated": [text, ...]}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from deviceplugin.fit import objects
from kubesim.ascend import ALLOCATED, COUNT, AscendNodeSpec, asks_ascend, verify_ascend
from kubesim.cluster import Placement, SimCluster
from kubesim.nodes import NodeSpec
from kubesim.verify import VISIBLE, ContainerView, own_scheduler_annotations, received, verify
from kubesim.workloads import Gang

ENV_SHOWN = (
    VISIBLE,
    "VOLCANO_GPU_ALLOCATED",
    "VOLCANO_GPU_MEMORY_TOTAL",
    "CUDA_DEVICE_MEMORY_LIMIT_0",
    "CUDA_DEVICE_MEMORY_LIMIT_1",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
)


@dataclass
class PodReport:
    placement: Placement
    pod: dict[str, Any]  # as the API server has it once the plugin is done with it
    containers: list[ContainerView]
    problems: list[str] = field(default_factory=list)
    gpus: dict[str, str] = field(default_factory=dict)  # GPU UUID -> index on its node

    @property
    def key(self) -> str:
        return f"{self.placement.namespace}/{self.placement.name}"

    def gpu_indices(self, view: ContainerView) -> str:
        """The container's GPUs as indices on its node (what `nvidia-smi` inside would number)."""
        visible = view.env.get(VISIBLE, "")
        if not visible:
            return "-"
        return ",".join(self.gpus.get(item, item) for item in visible.split(","))


def inspect(cluster: SimCluster, placement: Placement) -> PodReport:
    """The placed pod as it now stands, each container's share, and everything that is wrong."""
    pod = cluster.apiserver.get("pods", placement.name, placement.namespace) or placement.pod
    views, conflicts = received(pod, placement.admission)
    spec = next((s for s in cluster.node_specs if s.name == placement.node), None)
    gpus = spec.gpus if spec is not None else ()
    problems = [f"{placement.namespace}/{placement.name}: {placement.problem}"] if placement.problem else []
    problems += own_scheduler_annotations(placement.pod, pod)
    problems += [f"{placement.namespace}/{placement.name} {text}" for text in conflicts]
    if spec is not None and placement.admission is not None and placement.admission.admitted:
        problems += verify(pod, views, spec)
    npu_node = cluster.ascend_specs.get(placement.node)
    if npu_node is not None:
        problems += verify_ascend(pod, npu_node)
    elif placement.node and asks_ascend(pod):
        problems.append(
            f"{placement.namespace}/{placement.name}: asks Ascend vNPUs, bound to {placement.node}"
        )
    return PodReport(placement, pod, views, problems, {gpu.uuid: str(gpu.index) for gpu in gpus})


# --- JSON ----------------------------------------------------------------------------------------


def document(
    reports: Sequence[PodReport],
    nodes: Sequence[NodeSpec],
    gangs: Sequence[Gang],
    not_simulated: Sequence[str],
    error: str | None,
    *,
    ascend: Sequence[AscendNodeSpec] = (),
) -> dict[str, Any]:
    return {
        "ok": error is None and not any(report.problems for report in reports),
        "error": error,
        "pods": [_pod(report) for report in reports],
        "nodes": [_node(spec) for spec in nodes] + [_npu_node(spec) for spec in ascend],
        "gangs": [_gang(gang, reports) for gang in gangs],
        "not_simulated": list(not_simulated),
    }


def _pod(report: PodReport) -> dict[str, Any]:
    placement = report.placement
    return {
        "namespace": placement.namespace,
        "name": placement.name,
        "node": placement.node or None,
        "phase": objects.phase(report.pod) or "Pending",
        "problem": "; ".join(report.problems) or None,
        "annotations": dict(objects.annotations_of(report.pod)),
        "containers": [
            {
                "name": view.name,
                "env": dict(view.env),
                "mounts": [
                    {"container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only}
                    for m in view.mounts
                ],
            }
            for view in report.containers
        ],
    }


def _node(spec: NodeSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "strategy": spec.strategy,
        "mode": spec.mode,
        "memory_factor": spec.memory_factor,
        "gpus": [
            {"index": g.index, "uuid": g.uuid, "model": g.model, "memory": g.memory_mib} for g in spec.gpus
        ],
    }


def _npu_node(spec: AscendNodeSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "strategy": "ascend",
        "mode": spec.mode,
        "memory_factor": 1,
        "gpus": [],
        "annotations": spec.node({})["metadata"]["annotations"],
        "allocatable": spec.status()["allocatable"],
    }


def _gang(gang: Gang, reports: Sequence[PodReport]) -> dict[str, Any]:
    members = {f"{gang.namespace}/{name}" for name in gang.pods}
    bound = [r for r in reports if r.key in members and r.placement.node]
    return {
        "namespace": gang.namespace,
        "name": gang.name,
        "source": gang.source,
        "min_member": gang.min_member,
        "pods": list(gang.pods),
        "scheduled": len(bound) >= gang.min_member,
    }


# --- text ----------------------------------------------------------------------------------------


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def print_pods(reports: Sequence[PodReport]) -> None:
    """One row per container; the problems below the table."""
    rows = [["POD", "CONTAINER", "NODE", "GPU", "STATUS", "ENV (as the container sees it)"]]
    for report in reports:
        phase = objects.phase(report.pod) or "Pending"
        for view in report.containers:
            shown = " ".join(f"{k}={view.env[k]}" for k in ENV_SHOWN if k in view.env)
            node = report.placement.node or "-"
            rows.append([report.key, view.name, node, report.gpu_indices(view), phase, shown])
    print(table(rows))
    for report in reports:
        for problem in report.problems:
            print(f"  BAD: {problem}")


def print_mounts(reports: Sequence[PodReport]) -> None:
    """Each container's mounts, `container path <- host path (rw|ro)`."""
    for report in reports:
        for view in report.containers:
            for mount in view.mounts:
                access = "ro" if mount.read_only else "rw"
                shown = f"{mount.container_path} <- {mount.host_path} ({access})"
                print(f"  {report.key} {view.name} mounts {shown}")


def print_nodes(cluster: SimCluster) -> None:
    rows = [["NODE", "STRATEGY", "MODE", "FAKE GPUS", "LEDGER"]]
    rows += [
        [n.spec.name, n.spec.strategy, n.spec.mode or "-", n.spec.shape, str(n.ledger)]
        for n in cluster.nodes.values()
    ]
    rows += [[s.name, "ascend", s.mode, s.shape, "-"] for s in cluster.ascend_specs.values()]
    print(table(rows))
    for spec in cluster.ascend_specs.values():
        for key, value in spec.node({})["metadata"]["annotations"].items():
            print(f"{spec.name}: {key}={value}")
        print(f"{spec.name}: allocatable {COUNT}={spec.status()['allocatable'][COUNT]}")


def print_npu_annotations(reports: Sequence[PodReport]) -> None:
    """The annotations the extender bound each Ascend pod with (HAMi's plugin serves them)."""
    for report in reports:
        notes = objects.annotations_of(report.pod)
        if ALLOCATED not in notes:
            continue
        print(f"{report.key} bound to {report.placement.node} with:")
        for key in sorted(notes):
            if key.startswith(("hami.io/", "huawei.com/")) or key == "predicate-time":
                print(f"  {key}: {notes[key]}")


def print_gangs(gangs: Sequence[Gang], reports: Sequence[PodReport]) -> None:
    for gang in gangs:
        state = "scheduled" if _gang(gang, reports)["scheduled"] else "NOT scheduled"
        print(f"gang {gang.namespace}/{gang.name} ({gang.source}, minMember {gang.min_member}): {state}")
