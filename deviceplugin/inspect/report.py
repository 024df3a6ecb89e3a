"""A cluster report from a snapshot of nodes and pods."""

from __future__ import annotations

from deviceplugin.inspect.collect import node_report
from deviceplugin.inspect.model import Report, totals_of
from deviceplugin.inspect.source import Snapshot


def build_report(snapshot: Snapshot, *, keep_non_gpu: bool) -> Report:
    """Nodes without GPU resources or Ascend cards are left out unless `keep_non_gpu` (a node asked
    for by name)."""
    nodes = tuple(
        report
        for report in (node_report(node, pods) for node, pods in snapshot.nodes)
        if keep_non_gpu or report.strategy != "none" or report.ascend
    )
    return Report(nodes=nodes, totals=totals_of(nodes))
