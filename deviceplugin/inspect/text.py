"""The human-readable report: one row per GPU, one per Ascend card (with the pods on it), problems,
pending pods, cluster totals; `-d` adds the pods on each GPU and card with their memory and cores,
and the node's GPU interconnect as `nvidia-smi topo -m` draws it."""

from __future__ import annotations

from deviceplugin.fit.topology import UNKNOWN_NUMA, Topology
from deviceplugin.inspect.model import GpuReport, NodeReport, NpuCardReport, PodOnGpu, Ratio, Report
from deviceplugin.inspect.strategy import GPU_RESOURCES
from deviceplugin.inspect.table import format_table

HEADER = (
    "NAME",
    "IPADDRESS",
    "STRATEGY",
    "GPU",
    "MODE",
    "MEMORY(MiB)",
    "CORES(%)",
    "PODS",
    "PENDING",
    "HEALTH",
)
NPU_HEADER = (
    "NAME",
    "CHIP",
    "CARD",
    "ID",
    "MODE",
    "MEMORY(MiB)",
    "AICORE",
    "PODS",
    "PENDING",
    "HEALTH",
    "ON-CARD",
)
DASH = "-"
TOPOLOGY_LEGEND = (
    "NV<n>: n NVLinks; PIX: one PCIe switch; PXB: several switches; PHB: a host bridge; "
    "NODE: one NUMA node; SYS: across NUMA nodes"
)


def _used(used: int | None, total: int | None) -> str:
    return DASH if used is None or total is None else f"{used}/{total}"


def _pods(gpu: GpuReport) -> str:
    return f"{len(gpu.pods)}/{gpu.pod_limit}" if gpu.pod_limit is not None else str(len(gpu.pods))


def _gpu_cells(gpu: GpuReport) -> list[str]:
    return [
        str(gpu.index),
        gpu.mode or DASH,
        _used(gpu.memory_used_mib, gpu.memory_total_mib),
        _used(gpu.cores_used, gpu.cores_total),
        _pods(gpu),
        str(gpu.pending),
        "ok" if gpu.healthy else "unhealthy",
    ]


def _node_rows(node: NodeReport) -> list[list[str]]:
    lead = [node.name, node.address or DASH, node.strategy]
    if not node.gpus:
        return [[*lead, DASH, DASH, DASH, DASH, DASH, DASH, "see problems" if node.problems else DASH]]
    blank = ["", "", ""]
    return [[*(lead if i == 0 else blank), *_gpu_cells(gpu)] for i, gpu in enumerate(node.gpus)]


def _npu_rows(node: NodeReport) -> list[list[str]]:
    return [
        [
            node.name if i == 0 else "",
            card.chip,
            str(card.index),
            card.id,
            card.mode,
            f"{card.memory_used_mib}/{card.memory_total_mib}",
            f"{card.cores_used}/{card.cores_total}",
            f"{len(card.pods)}/{card.pod_limit}",
            str(card.pending),
            "ok" if card.healthy else "unhealthy",
            ",".join(f"{pod.namespace}/{pod.name}" for pod in card.pods) or DASH,
        ]
        for i, card in enumerate(node.npus)
    ]


def _ratio(ratio: Ratio, unit: str = "") -> str:
    return f"{ratio.allocated}/{ratio.total}{unit} ({ratio.percent}%)"


def _pending_lines(report: Report) -> list[str]:
    rows = []
    for node in report.nodes:
        pending: dict[tuple[str, str], list[str]] = {}
        devices: list[tuple[str, GpuReport | NpuCardReport]] = [(str(gpu.index), gpu) for gpu in node.gpus]
        devices += [(f"{card.chip} {card.index}", card) for card in node.npus]
        for label, device in devices:
            for pod in device.pods:
                if pod.state == "pending":
                    pending.setdefault((pod.namespace, pod.name), []).append(label)
        rows += [[node.name, f"{ns}/{name}", ",".join(gpus)] for (ns, name), gpus in sorted(pending.items())]
    if not rows:
        return []
    title = "Pending (scheduled, not yet served by the device plugin):"
    return ["", title, *format_table(("NODE", "POD", "GPU"), rows, indent="  ")]


def _problem_lines(report: Report) -> list[str]:
    lines = [f"  {node.name}: {problem}" for node in report.nodes for problem in node.problems]
    return ["", "Problems:", *lines] if lines else []


def _pod_cells(gpu: GpuReport, pod: PodOnGpu) -> list[str]:
    memory = DASH if pod.memory_mib is None else str(pod.memory_mib)
    cores = DASH if pod.cores is None else str(pod.cores)
    return [str(gpu.index), f"{pod.namespace}/{pod.name}", memory, cores, pod.state]


def _gpu_label(gpu: GpuReport) -> str:
    known = [part for part in (gpu.uuid, gpu.model) if part]
    return f"GPU {gpu.index}" + (f" ({', '.join(known)})" if known else "")


def _detail_lines(node: NodeReport) -> list[str]:
    kinds: list[str] = [node.strategy] if node.gpus or node.strategy != "none" or not node.npus else []
    kinds += ["ascend"] if node.npus else []
    lines = ["", f"{node.name} ({', '.join(kinds)}):"]
    if node.gpus or not node.npus:
        lines += [f"  {_gpu_label(gpu)}" for gpu in node.gpus if gpu.uuid or gpu.model]
        rows = [_pod_cells(gpu, pod) for gpu in node.gpus for pod in gpu.pods]
        header = ("GPU", "POD", "MEMORY(MiB)", "CORES(%)", "STATE")
        lines += format_table(header, rows, indent="  ") if rows else ["  no pods on its GPUs"]
        slots = [
            [str(gpu.index), f"{slot.group}-{slot.position}", f"{slot.namespace}/{slot.name}"]
            for gpu in node.gpus
            for slot in gpu.mig_slots
        ]
        if slots:
            lines += ["  MIG slots in use:", *format_table(("GPU", "SLOT", "POD"), slots, indent="    ")]
        if node.topology is not None:
            lines += _topology_lines(node.topology)
    if node.npus:
        rows = [
            [
                f"{card.chip} {card.index} ({card.id})",
                f"{pod.namespace}/{pod.name}",
                str(pod.memory_mib),
                str(pod.cores),
                pod.state,
            ]
            for card in node.npus
            for pod in card.pods
        ]
        header = ("CARD", "POD", "MEMORY(MiB)", "AICORE", "STATE")
        lines += format_table(header, rows, indent="  ") if rows else ["  no pods on its Ascend cards"]
    return lines


def _topology_lines(topology: Topology) -> list[str]:
    """The pair matrix with each GPU's NUMA node, like `nvidia-smi topo -m`."""
    names = [f"GPU{gpu}" for gpu in topology.gpus]
    rows = [
        [
            name,
            *("X" if a == b else str(topology.link(a, b)) for b in topology.gpus),
            DASH if topology.numa_of(a) == UNKNOWN_NUMA else str(topology.numa_of(a)),
        ]
        for name, a in zip(names, topology.gpus, strict=True)
    ]
    table = format_table(("", *names, "NUMA"), rows, indent="    ")
    return ["  GPU topology:", *table, f"    {TOPOLOGY_LEGEND}"]


def render_text(report: Report, *, details: bool = False) -> str:
    if not report.nodes:
        return f"No GPU nodes found: no node publishes a GPU resource ({GPU_RESOURCES}) nor Ascend cards.\n"
    # A node with Ascend cards and no GPU resource has no GPU row.
    gpu_nodes = [node for node in report.nodes if node.gpus or node.strategy != "none" or not node.npus]
    rows = [row for node in gpu_nodes for row in _node_rows(node)]
    lines = format_table(HEADER, rows) if rows else []
    npu_rows = [row for node in report.nodes for row in _npu_rows(node)]
    if npu_rows:
        lines += ["", "Ascend vNPUs:", *format_table(NPU_HEADER, npu_rows, indent="  ")]
    if details:
        for node in report.nodes:
            lines += _detail_lines(node)
    lines += _pending_lines(report)
    lines += _problem_lines(report)
    lines.append("-" * 60)
    totals = report.totals
    if totals.memory_mib.total:
        lines.append(f"Allocated/Total GPU Memory In Cluster: {_ratio(totals.memory_mib, ' MiB')}")
    if gpu_nodes:
        lines.append(f"Allocated/Total GPUs In Cluster: {_ratio(totals.gpus)}")
    if totals.npus.total:
        lines.append(
            f"Allocated/Total Ascend vNPU Memory In Cluster: {_ratio(totals.npu_memory_mib, ' MiB')}"
        )
        lines.append(f"Allocated/Total Ascend Cards In Cluster: {_ratio(totals.npus)}")
    return "\n".join(lines) + "\n"
