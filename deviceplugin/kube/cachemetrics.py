"""Prometheus series of list+watch caches, shared by the daemon's and the extender's `/metrics`:
objects rejected (unreadable, counted once per object and reason), by the kind of object the cache
holds. A failure of a cache's loop is a crash of its worker, counted with the other workers'
(`deviceplugin.workermetrics`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from deviceplugin.kube.podcache import ListWatchCache, rejected_by_kind


def cache_metrics(prefix: str, rejected: Mapping[str, int]) -> Iterator[Metric]:
    rejected_family = CounterMetricFamily(
        f"{prefix}_objects_rejected",
        "API objects that could not be read (malformed, or a bug reading them), each once per reason; "
        "every other object is still processed",
        labels=["kind"],
    )
    for kind in sorted(rejected):
        rejected_family.add_metric([kind], rejected[kind])
    yield rejected_family


class CacheCollector(Collector):
    """`cache_metrics` for a registry of its own (the extender's)."""

    def __init__(self, prefix: str, caches: Iterable[ListWatchCache]) -> None:
        self.prefix = prefix
        self.caches = tuple(caches)

    def collect(self) -> Iterator[Metric]:
        return cache_metrics(self.prefix, rejected_by_kind(self.caches))
