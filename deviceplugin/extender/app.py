"""The extender assembled: node and pod caches feeding the inventory, the service, the HTTP server.

`Extender(config, kube).start()` runs it in-process (tests, `simulate`); `run(config)` runs it until
SIGTERM or SIGINT (the `deviceplugin extender` command).
"""

from __future__ import annotations

import signal
import threading
from types import TracebackType
from typing import Self

from prometheus_client import CollectorRegistry

from deviceplugin.extender.config import ExtenderConfig
from deviceplugin.extender.http import ExtenderHttpServer
from deviceplugin.extender.inventory import Inventory
from deviceplugin.extender.service import ExtenderService
from deviceplugin.extender.slim import extender_node, extender_pod
from deviceplugin.fit.families import ascend_families
from deviceplugin.httpserver import HttpCollector
from deviceplugin.kube.api import Kube, Obj, load_client
from deviceplugin.kube.cachemetrics import CacheCollector
from deviceplugin.kube.podcache import NodeCache, PodCache
from deviceplugin.logs import get_log
from deviceplugin.memory import freeze_startup_objects, return_large_buffers_to_the_os, trim_heap
from deviceplugin.supervisor import Supervisor
from deviceplugin.workermetrics import WorkerCollector

log = get_log(__name__)

SYNC_TIMEOUT_S = 30.0
METRICS_PREFIX = "volcano_gpu_extender"


class CachePodFinder:
    """Pods from the cluster pod cache, by UID (by namespace/name when no UID is given)."""

    def __init__(self, cache: PodCache) -> None:
        self.cache = cache

    def _lookup(self, namespace: str, name: str, uid: str) -> Obj | None:
        if uid:
            return self.cache.get(uid)
        for pod in self.cache.pods():
            meta = pod.get("metadata") or {}
            if meta.get("name") == name and (meta.get("namespace") or "default") == namespace:
                return pod
        return None

    def find(self, namespace: str, name: str, uid: str, timeout_s: float) -> Obj | None:
        pod = self._lookup(namespace, name, uid)
        if pod is None and timeout_s > 0:
            self.cache.wait_until(lambda _: self._lookup(namespace, name, uid) is not None, timeout_s)
            pod = self._lookup(namespace, name, uid)
        return pod


class Extender:
    """A running extender. `address` overrides `config.address` (e.g. `127.0.0.1:0` for a free port)."""

    def __init__(
        self, config: ExtenderConfig, kube: Kube | None = None, *, address: str | None = None
    ) -> None:
        self.config = config
        self.kube = kube if kube is not None else Kube(load_client(config.kubeconfig))
        self.supervisor = Supervisor()  # restarts the caches' workers after a crash
        # Each cached object keeps only what the decisions read (deviceplugin.extender.slim).
        self.nodes = NodeCache(self.kube, supervisor=self.supervisor, slim=extender_node)
        self.pods = PodCache(self.kube, None, supervisor=self.supervisor, slim=extender_pod)
        self.inventory = Inventory(
            config.strategy,
            config.compat,
            nodes=self.nodes.rejections,
            pods=self.pods.rejections,
            ascend=ascend_families(config.vnpus) if config.serves_ascend else (),
            mig_geometries=config.mig_geometries,
        )
        self.nodes.add_listener(self.inventory.on_node)
        self.pods.add_listener(self.inventory.on_pod)
        self.service = ExtenderService(
            config,
            self.inventory,
            pods=CachePodFinder(self.pods),
            binder=self.kube.bind_pod,
            readiness=self.readiness,
        )
        self.nodes.add_listener(self.service.supernodes.on_node)
        self.pods.add_listener(self.service.supernodes.on_pod)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(CacheCollector(METRICS_PREFIX, (self.nodes, self.pods)))
        registry.register(WorkerCollector(METRICS_PREFIX, self.supervisor))
        self.http = ExtenderHttpServer(self.service, address or config.address, registry)
        registry.register(HttpCollector(METRICS_PREFIX, self.http.stats))

    def synced(self) -> bool:
        return self.nodes.synced and self.pods.synced

    def readiness(self) -> list[str]:
        """Why the extender cannot decide now, one line each: a cache not synced with the API
        server, a worker down or restarting in a loop. Empty when ready."""
        caches: tuple[tuple[str, NodeCache | PodCache], ...] = (("node", self.nodes), ("pod", self.pods))
        unsynced = [f"{name} cache not synced with the API server" for name, c in caches if not c.synced]
        return unsynced + self.supervisor.problems()

    @property
    def url(self) -> str:
        return self.http.url

    def start(self, sync_timeout_s: float = SYNC_TIMEOUT_S) -> Self:
        """Start the caches and the server; wait up to `sync_timeout_s` for the caches (0: do not
        wait; until they sync, requests get an Error saying so and /healthz answers 503)."""
        self.nodes.start()
        self.pods.start()
        self.http.start()
        if sync_timeout_s > 0 and not (
            self.nodes.wait_synced(sync_timeout_s) and self.pods.wait_synced(sync_timeout_s)
        ):
            log.warning("extender caches not synced yet", waited_s=sync_timeout_s)
        return self

    def stop(self) -> None:
        self.http.stop()
        self.pods.stop()
        self.nodes.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def settle() -> None:
    """Once the caches hold the cluster: keep what they hold out of the collector's full passes
    (a pass walked every cached object: 250-300 ms stalls at 5,000 nodes), and give the OS back
    the free pages the first lists left scattered in the C heap (malloc_trim; ~1 KB per node)."""
    freeze_startup_objects()
    trim_heap()


def run(config: ExtenderConfig) -> int:
    """Serve until SIGTERM or SIGINT."""
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    return_large_buffers_to_the_os()  # the first lists of every node and pod run to hundreds of MB
    extender = Extender(config)
    extender.start(sync_timeout_s=0)
    log.info(
        "extender started",
        url=extender.url,
        strategy=config.strategy,
        policy=config.policy,
        weight=config.weight,
        gpu_aware=f"weight={config.gpu_aware_weight:g},loss.weight={config.gpu_aware_loss_weight:g}",
        compat=config.compat or "none",
        ascend=",".join(chip.common_word for chip in config.vnpus.chips if config.serves_ascend) or "none",
    )
    try:
        frozen = False
        while not stopping.wait(1.0):
            if not frozen and extender.synced():
                settle()
                frozen = True
    finally:
        extender.stop()
        log.info("extender stopped")
    return 0
