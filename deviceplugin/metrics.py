"""Prometheus metrics, `/healthz` and `/readyz` on `--metrics-address` (SPEC §9).

Everything is read from the running daemon at scrape time: GPU usage from the ledger (so the
figures survive restarts and never drift the way counters kept by hand do), health from the
health state, the rest from counters the parts keep. The vGPU gauges carry Volcano's scheduler
names, labels (`NodeName`, `devID`, `podName`, plus `podNamespace`) and units, so one dashboard
reads both exporters: memory in units of `--gpu-memory-factor` MiB (those of `node-vgpu-register`
and `devices-to-allocate`, which Volcano exports; MiB at the default factor 1), cores in percent.
Every strategy fills them: share mode fills memory and leaves cores at 0, number mode gives whole
GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from http import HTTPStatus
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from deviceplugin.config import DaemonConfig
from deviceplugin.httpserver import HttpServer, HttpStats, KiB, Limits, Request, Response
from deviceplugin.kube.cachemetrics import cache_metrics
from deviceplugin.logs import get_log
from deviceplugin.options import split_address
from deviceplugin.plugin.daemon import Daemon
from deviceplugin.plugin.snapshot import DaemonSnapshot
from deviceplugin.workermetrics import worker_metrics

log = get_log(__name__)

PLUGIN = "volcano_gpu_plugin"
UNITS = "in units of gpu-memory-factor MiB (Volcano's)"
# Scrapes and probes: GET with small headers and no body, a few at a time; a request must arrive
# whole within --metrics-request-timeout.
METRICS_LIMITS = Limits(max_body_bytes=16 * KiB, max_header_bytes=16 * KiB, max_connections=64, workers=2)
# Allocate is served from memory and one fsync: the interesting range is 0.5 ms .. 1 s, plus the
# waits for a pod the cache has not seen yet (up to the 5 s deadline).
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class DaemonCollector(Collector):
    """Renders the daemon's snapshot (`Daemon.snapshot()`), taken on every scrape."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Metric]:
        taken = self.daemon.snapshot()
        yield from _vgpu_gauges(taken)
        yield from _health(taken)
        yield from _modes(taken)
        yield from _plugin(taken)


def _vgpu_gauges(taken: DaemonSnapshot) -> Iterator[Metric]:
    device = ["NodeName", "devID"]
    shared = GaugeMetricFamily("volcano_vgpu_device_shared_number", "Pods sharing the GPU", labels=device)
    memory = GaugeMetricFamily(
        "volcano_vgpu_device_allocated_memory", f"GPU memory allocated to pods, {UNITS}", labels=device
    )
    cores = GaugeMetricFamily(
        "volcano_vgpu_device_allocated_cores", "GPU compute allocated to pods, percent", labels=device
    )
    limit = GaugeMetricFamily("volcano_vgpu_device_memory_limit", f"GPU memory, {UNITS}", labels=device)
    for gpu in taken.gpus:
        labels = [taken.node_name, gpu.uuid]
        shared.add_metric(labels, gpu.pods)
        memory.add_metric(labels, gpu.memory)
        cores.add_metric(labels, gpu.cores)
        limit.add_metric(labels, gpu.memory_limit)
    # podNamespace beyond Volcano's labels: two pods of one name would be one series otherwise
    per_pod = [*device, "podName", "podNamespace"]
    pod_memory = GaugeMetricFamily(
        "volcano_vgpu_device_memory_allocation_for_a_certain_pod",
        f"GPU memory allocated to the pod, {UNITS}",
        labels=per_pod,
    )
    pod_cores = GaugeMetricFamily(
        "volcano_vgpu_device_core_allocation_for_a_certain_pod",
        "GPU compute allocated to the pod, percent",
        labels=per_pod,
    )
    for pod in taken.pods:
        labels = [taken.node_name, pod.uuid, pod.pod_name, pod.namespace]
        pod_memory.add_metric(labels, pod.memory)
        pod_cores.add_metric(labels, pod.cores)
    yield from (shared, memory, cores, limit, pod_memory, pod_cores)


def _health(taken: DaemonSnapshot) -> Iterator[Metric]:
    healthy = GaugeMetricFamily(
        f"{PLUGIN}_device_healthy", "1 while the GPU is healthy", labels=["devID", "index"]
    )
    for gpu in taken.gpus:
        healthy.add_metric([gpu.uuid, str(gpu.index)], 1 if gpu.healthy else 0)
    xids = CounterMetricFamily(f"{PLUGIN}_xid_events", "Xid events seen", labels=["devID", "xid"])
    for (uuid, xid), count in sorted(taken.xid_events.items()):
        xids.add_metric([uuid, str(xid)], count)
    yield from (healthy, xids)


def _modes(taken: DaemonSnapshot) -> Iterator[Metric]:
    mode = GaugeMetricFamily(
        f"{PLUGIN}_device_mode",
        "1 for the way the GPU is shared: share, number, hami-core or mig",
        labels=["devID", "index", "mode"],
    )
    for gpu in taken.gpus:
        mode.add_metric([gpu.uuid, str(gpu.index), gpu.mode], 1)
    yield mode


def _counter(name: str, text: str, labels: list[str], counts: Mapping[Any, int]) -> CounterMetricFamily:
    """A counter family with one sample per key (a tuple key gives one label each), in key order."""
    family = CounterMetricFamily(name, text, labels=labels)
    for key, count in sorted(counts.items()):
        family.add_metric([str(part) for part in (key if isinstance(key, tuple) else (key,))], count)
    return family


def _plugin(taken: DaemonSnapshot) -> Iterator[Metric]:
    allocate = taken.allocate
    yield _counter(
        f"{PLUGIN}_allocate_failures", "Allocate calls refused, by reason", ["reason"], allocate.failures
    )
    yield _counter(
        f"{PLUGIN}_allocate_gpu_mismatches",
        "Allocate calls whose kubelet device IDs were not on the scheduler's GPUs",
        ["resource"],
        allocate.mismatches,
    )
    yield _counter(
        f"{PLUGIN}_allocate_same_count_resolved",
        "Allocate calls with several pods asking the same count, by what told them apart "
        "(pod-resources, ledger, arrival, same-placement)",
        ["resource", "signal"],
        allocate.resolved,
    )
    yield _counter(
        f"{PLUGIN}_allocation_swaps_corrected",
        "Containers kubelet's pod-resources showed served as another pod, corrected in the ledger "
        "and the scheduler's annotations",
        ["resource"],
        allocate.swaps,
    )
    listed = GaugeMetricFamily(
        f"{PLUGIN}_listandwatch_bytes", "Size of the current ListAndWatch message", labels=["resource"]
    )
    for resource, size in taken.listandwatch_bytes.items():
        listed.add_metric([resource], size)
    yield listed
    yield _counter(
        f"{PLUGIN}_registrations", "Successful registrations with kubelet", ["resource"], taken.registrations
    )
    yield GaugeMetricFamily(
        f"{PLUGIN}_ledger_allocations", "Live ledger allocations", value=taken.ledger.allocations
    )
    yield GaugeMetricFamily(
        f"{PLUGIN}_outbox_backlog", "API patches waiting to be sent", value=taken.ledger.outbox_backlog
    )
    yield _counter(
        f"{PLUGIN}_ledger_storage_errors",
        "Ledger reads and writes the disk under --state-dir failed, by problem (disk-full, read-only, "
        "io-error, corrupt, locked)",
        ["problem"],
        taken.ledger.storage_errors,
    )
    waiting = GaugeMetricFamily(
        f"{PLUGIN}_allocate_waiting",
        "Allocate calls waiting (up to --allocate-timeout) for their pod to reach the pod cache",
        labels=["resource"],
    )
    for resource, count in sorted(allocate.waiting.items()):
        waiting.add_metric([resource], count)
    yield waiting
    if taken.api is not None:
        yield GaugeMetricFamily(
            f"{PLUGIN}_pod_cache_staleness_seconds",
            "How long the pod cache may have missed changes (0 while its watch is open)",
            value=taken.api.pod_cache_staleness_s,
        )
        yield from cache_metrics(PLUGIN, taken.api.rejected)
        yield _counter(
            f"{PLUGIN}_outbox_batches",
            "Outbox passes, by what started them: backlog (the pass before left over a batch due) "
            "or wait (new entries, a back-off ending)",
            ["started_by"],
            taken.api.outbox_batches,
        )
        yield _counter(
            f"{PLUGIN}_outbox_entries",
            "Outbox entries, by outcome: sent (a pod's entries merged into one patch), pod-gone "
            "(dropped unsent: the pod cache saw the pod deleted), refused (dropped on 404 or 422), "
            "retried",
            ["outcome"],
            taken.api.outbox_entries,
        )
    yield from worker_metrics(PLUGIN, taken.worker_restarts)
    if taken.api_errors is not None:
        yield _counter(
            f"{PLUGIN}_api_errors", "Failed Kubernetes API calls", ["call", "status"], taken.api_errors
        )


def readiness(daemon: Daemon) -> list[str]:
    """Why the daemon is not ready, one line each; empty when it is: registered with kubelet, pod
    cache synced, ledger writable, and no background worker down after a crash or restarting in a
    loop."""
    services = daemon.services
    problems = []
    if services.registrar is None or not services.registrar.registered:
        problems.append("not registered with kubelet")
    if services.kube is not None and not services.kube.pods.synced:
        problems.append("pod cache not synced with the API server")
    unwritable = services.ledger.problem()  # tries a write again: clears once the disk recovers
    if unwritable is not None:
        problems.append(str(unwritable))
    return problems + daemon.supervisor.problems()


def registry_for(daemon: Daemon) -> CollectorRegistry:
    """The daemon's collectors and the Allocate latency histogram (fed by `daemon.stats`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(daemon))
    latency = Histogram(
        f"{PLUGIN}_allocate_duration_seconds",
        "Allocate latency by resource and outcome",
        ["resource", "outcome"],
        buckets=LATENCY_BUCKETS,
        registry=registry,
    )
    daemon.stats.observe_with(lambda resource, outcome, s: latency.labels(resource, outcome).observe(s))
    return registry


class MetricsServer:
    """One HTTP listener: `/metrics`, `/healthz` (the process answers), `/readyz`, on the bounded
    server (`deviceplugin.httpserver`, `METRICS_LIMITS`); `stats` counts what its limits refused."""

    def __init__(
        self, daemon: Daemon, address: str, registry: CollectorRegistry, stats: HttpStats | None = None
    ) -> None:
        self.daemon = daemon
        self.registry = registry
        host, port = split_address(address)
        limits = replace(METRICS_LIMITS, request_timeout_s=daemon.config.metrics_request_timeout)
        self._http = HttpServer((host or "0.0.0.0", port), self._handle, limits, name="metrics", stats=stats)

    @property
    def port(self) -> int:
        return self._http.server_address[1]

    def start(self) -> None:
        self._http.start()
        log.info("metrics listening", host=self._http.server_address[0], port=self.port)

    def stop(self) -> None:
        self._http.stop()

    def configure(self, config: DaemonConfig) -> None:
        """Apply a reloaded --metrics-request-timeout (the address is the caller's: it moves the
        listener)."""
        if config.metrics_request_timeout != self._http.limits.request_timeout_s:
            self._http.limits = replace(self._http.limits, request_timeout_s=config.metrics_request_timeout)
            log.info("metrics request timeout changed", seconds=config.metrics_request_timeout)

    def _handle(self, request: Request) -> Response:
        if request.method != "GET":
            return Response(HTTPStatus.METHOD_NOT_ALLOWED, b"GET only\n", headers=(("Allow", "GET"),))
        if request.path == "/metrics":
            return Response(HTTPStatus.OK, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        if request.path == "/healthz":
            return Response(HTTPStatus.OK, b"ok\n")
        if request.path == "/readyz":
            problems = readiness(self.daemon)
            status = HTTPStatus.SERVICE_UNAVAILABLE if problems else HTTPStatus.OK
            return Response(status, ("\n".join(problems) or "ok").encode() + b"\n")
        return Response(HTTPStatus.NOT_FOUND, b"not found: try /metrics, /healthz or /readyz\n")
