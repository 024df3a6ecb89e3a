"""The restarts of a `Supervisor`'s workers as a Prometheus counter, for the daemon's and the
extender's `/metrics`: `<prefix>_worker_restarts_total{worker}`, every worker started listed (0
until it first crashes)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from deviceplugin.supervisor import Supervisor


def worker_metrics(prefix: str, restarts_by_worker: Mapping[str, int]) -> Iterator[Metric]:
    restarts = CounterMetricFamily(
        f"{prefix}_worker_restarts",
        "Crashes of a background worker (an exception out of its loop), each logged and followed by "
        "a restart after a back-off",
        labels=["worker"],
    )
    for name, count in sorted(restarts_by_worker.items()):
        restarts.add_metric([name], count)
    yield restarts


class WorkerCollector(Collector):
    """`worker_metrics` for a registry of its own (the extender's)."""

    def __init__(self, prefix: str, supervisor: Supervisor) -> None:
        self.prefix = prefix
        self.supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        return worker_metrics(self.prefix, self.supervisor.restarts())
