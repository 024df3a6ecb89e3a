"""`-o json`: a stable document (shape in docs/inspect.md). Keys are always present; a value that a
node does not publish is null rather than missing."""

from __future__ import annotations

import itertools
import json
from typing import Any

from deviceplugin.fit.topology import Topology
from deviceplugin.inspect.model import GpuReport, MigSlot, NodeReport, NpuCardReport, PodOnGpu, Ratio, Report

KIND = "GpuInspection"
VERSION = 1


def _pair(used: int | None, total: int | None) -> dict[str, int] | None:
    return None if used is None or total is None else {"allocated": used, "total": total}


def _ratio(ratio: Ratio) -> dict[str, int]:
    return {"allocated": ratio.allocated, "total": ratio.total, "percent": ratio.percent}


def _pod(pod: PodOnGpu) -> dict[str, Any]:
    return {
        "namespace": pod.namespace,
        "name": pod.name,
        "uid": pod.uid,
        "memoryMiB": pod.memory_mib,
        "cores": pod.cores,
        "state": pod.state,
    }


def _slot(slot: MigSlot) -> dict[str, Any]:
    return {
        "group": slot.group,
        "position": slot.position,
        "namespace": slot.namespace,
        "name": slot.name,
        "uid": slot.uid,
    }


def _gpu(gpu: GpuReport) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "model": gpu.model,
        "mode": gpu.mode,
        "healthy": gpu.healthy,
        "memoryMiB": _pair(gpu.memory_used_mib, gpu.memory_total_mib),
        "cores": _pair(gpu.cores_used, gpu.cores_total),
        "podCount": len(gpu.pods),
        "podLimit": gpu.pod_limit,
        "pendingCount": gpu.pending,
        "pods": [_pod(pod) for pod in gpu.pods],
        "migSlots": [_slot(slot) for slot in gpu.mig_slots],
    }


def _npu(card: NpuCardReport) -> dict[str, Any]:
    return {
        "chip": card.chip,
        "index": card.index,
        "id": card.id,
        "mode": card.mode,
        "healthy": card.healthy,
        "memoryMiB": _pair(card.memory_used_mib, card.memory_total_mib),
        "aiCores": _pair(card.cores_used, card.cores_total),
        "podCount": len(card.pods),
        "podLimit": card.pod_limit,
        "pendingCount": card.pending,
        "pods": [_pod(pod) for pod in card.pods],
    }


def _topology(topology: Topology | None) -> dict[str, Any] | None:
    if topology is None:
        return None
    pairs = itertools.combinations(topology.gpus, 2)
    return {
        "gpus": list(topology.gpus),
        "numa": list(topology.numa),
        "links": {f"{a}-{b}": str(topology.link(a, b)) for a, b in pairs},
    }


def _node(node: NodeReport) -> dict[str, Any]:
    publishes_memory = any(gpu.memory_total_mib is not None for gpu in node.gpus)
    return {
        "name": node.name,
        "address": node.address,
        "strategy": node.strategy,
        "memoryFactorMiB": node.memory_factor,
        "memoryMiB": _pair(node.memory_used_mib, node.memory_total_mib) if publishes_memory else None,
        "gpus": [_gpu(gpu) for gpu in node.gpus],
        "npus": [_npu(card) for card in node.npus],
        "topology": _topology(node.topology),
        "problems": list(node.problems),
    }


def report_document(report: Report) -> dict[str, Any]:
    return {
        "kind": KIND,
        "version": VERSION,
        "nodes": [_node(node) for node in report.nodes],
        "cluster": {
            "memoryMiB": _ratio(report.totals.memory_mib),
            "gpus": _ratio(report.totals.gpus),
            "npuMemoryMiB": _ratio(report.totals.npu_memory_mib),
            "npus": _ratio(report.totals.npus),
        },
    }


def render_json(report: Report) -> str:
    return json.dumps(report_document(report), indent=2) + "\n"
