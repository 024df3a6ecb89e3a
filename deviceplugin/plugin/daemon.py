"""The node daemon's parts, their start-up, reload and shutdown (`deviceplugin run` drives it:
see `deviceplugin.runner`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from deviceplugin import logs
from deviceplugin.config import DaemonConfig
from deviceplugin.fit import keys
from deviceplugin.fit.topology import Topology
from deviceplugin.gpu.base import BackendError, GpuBackend, GpuInfo
from deviceplugin.gpu.exclude import GpuExclusion
from deviceplugin.gpu.health import HealthMonitor, HealthState, XidPolicy
from deviceplugin.gpu.load import load_backend
from deviceplugin.gpu.mig import builtin_geometries
from deviceplugin.gpu.mps import MpsControl, MpsDaemons, MpsRoot
from deviceplugin.kube.api import ConfigError, Kube, load_client
from deviceplugin.kube.events import EventRecorder, Involved
from deviceplugin.kube.handshake import Handshake
from deviceplugin.kube.node import NodePublisher, NodeWatch
from deviceplugin.kube.podcache import PodCache, rejected_by_kind
from deviceplugin.ledger import Ledger, LedgerError, StorageListener
from deviceplugin.ledgerfiles import StorageError
from deviceplugin.plugin.allocate import AllocationStats, Allocator, PodAllocator
from deviceplugin.plugin.devices import DeviceList, FactorError, Layout, check_layout, smallest_factor
from deviceplugin.plugin.families import node_family_of
from deviceplugin.plugin.family import AllocatorParts, NodeFamily, PodApi
from deviceplugin.plugin.hook import HookPath
from deviceplugin.plugin.nodestate import with_topology
from deviceplugin.plugin.outbox import OutboxWorker
from deviceplugin.plugin.pending import asks_for
from deviceplugin.plugin.podfields import daemon_pod
from deviceplugin.plugin.podresources import read_listing
from deviceplugin.plugin.recover import rebuild_ledger
from deviceplugin.plugin.registrar import Registrar
from deviceplugin.plugin.release import Rebuild, Releaser
from deviceplugin.plugin.server import PluginServer
from deviceplugin.plugin.service import DevicePluginService
from deviceplugin.plugin.vgpumig import MigCards
from deviceplugin.supervisor import Supervisor

if TYPE_CHECKING:
    import kubernetes

    from deviceplugin.plugin.snapshot import DaemonSnapshot

log = logs.get_log(__name__)

EXIT_CONFIG = 2
EXIT_FAILED = 1
# How long a first start asks kubelet whether containers hold its devices (`_nothing_held`).
NOTHING_HELD_TIMEOUT_S = 2.0


class StartupError(Exception):
    """The daemon cannot start; `exit_code` says whether the configuration is to blame."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def choose_layout(config: DaemonConfig, gpus: tuple[GpuInfo, ...]) -> Layout:
    """The memory factor and split count, checked against kubelet's message limit."""
    resources = node_family_of(config.gpu_strategy).resources
    if isinstance(config.gpu_memory_factor, int):
        factor = config.gpu_memory_factor
    else:
        factor = smallest_factor(
            resources,
            gpus,
            config.vgpu_split_count,
            memory_scaling=config.vgpu_memory_scaling,
            core_scaling=config.vgpu_core_scaling,
        )
        log.info("memory factor chosen", factor=factor, mib_per_device=factor)
    layout = Layout(factor, config.vgpu_split_count, config.vgpu_memory_scaling, config.vgpu_core_scaling)
    check_layout(resources, gpus, layout)
    return layout


def _offered(exclusion: GpuExclusion | None, gpus: tuple[GpuInfo, ...]) -> tuple[GpuInfo, ...]:
    """The GPUs this node shares: all but those `--exclude-gpus` (HAMi's filterdevices) names."""
    if exclusion is None:
        return gpus
    for entry in exclusion.unmatched(gpus):
        log.warning("--exclude-gpus names no GPU of this node", entry=entry)
    for gpu in gpus:
        if exclusion.excludes(gpu):
            log.info("gpu excluded: not advertised, registered or watched", index=gpu.index, uuid=gpu.uuid)
    return tuple(gpu for gpu in gpus if not exclusion.excludes(gpu))


def _mig_cards(config: DaemonConfig, backend: GpuBackend, gpus: tuple[GpuInfo, ...]) -> MigCards | None:
    """A mig vGPU node's cards, each checked: one that cannot run MIG here stops the start (the
    backend closed), since Volcano takes the node's mode from its last card and would give MIG
    slots or HAMi-core shares to the wrong cards of a mixed node."""
    if config.vgpu_mode != keys.MODE_MIG:  # set only on vGPU nodes (config.STRATEGY_ONLY)
        return None
    geometries = config.vgpu_mig_geometries
    cards = MigCards(backend, gpus, builtin_geometries() if geometries is None else geometries)
    if cards.problems:
        backend.close()
        raise StartupError(
            "--vgpu-mode mig: every GPU of the node must run MIG; "
            + "; ".join(cards.problems)
            + " (exclude such a GPU with --exclude-gpus, or run the node in hami-core)",
            EXIT_CONFIG,
        )
    return cards


def _mps_daemons(
    config: DaemonConfig, gpus: tuple[GpuInfo, ...], health: HealthState, supervisor: Supervisor
) -> MpsDaemons | None:
    """An mps vGPU node's control daemons, one per GPU (docs/mps.md)."""
    if config.vgpu_mode != keys.MODE_MPS:
        return None
    control = MpsControl(config.mps_control, MpsRoot(config.mps_root))
    uuids = tuple(gpu.uuid for gpu in gpus)
    return MpsDaemons(control, uuids, health, managed=not config.mps_sidecar, supervisor=supervisor)


@dataclass
class GpuSide:
    """The backend, the enumerated GPUs and their health: kept across plugin reloads."""

    backend: GpuBackend
    gpus: tuple[GpuInfo, ...]
    health: HealthState
    monitor: HealthMonitor
    mig: MigCards | None = None  # a mig vGPU node's cards
    mps: MpsDaemons | None = None  # an mps vGPU node's control daemons
    topology: Topology | None = None  # how the offered GPUs connect (None: unknown)

    @classmethod
    def start(cls, config: DaemonConfig, env: Mapping[str, str], supervisor: Supervisor) -> GpuSide:
        try:
            backend = load_backend(config.fake_gpus, config.fake_gpu_events, config.fake_gpu_topology)
        except BackendError as err:
            if config.fake_gpus is not None:
                raise StartupError(f"--fake-gpus {config.fake_gpus!r}: {err}", EXIT_CONFIG) from None
            raise StartupError(f"cannot use the GPUs: {err}") from None
        inventory = backend.inventory()
        for failure in inventory.errors:
            log.error("gpu failed to enumerate", index=failure.index, error=failure.message)
        if not inventory.gpus:
            backend.close()
            raise StartupError("no usable GPU found on this node")
        for gpu in inventory.gpus:
            log.info(
                "gpu",
                index=gpu.index,
                uuid=gpu.uuid,
                model=gpu.model,
                memory_mib=gpu.memory_mib,
                numa=gpu.numa,
            )
        gpus = _offered(config.exclude_gpus, inventory.gpus)
        if not gpus:
            backend.close()
            raise StartupError(
                f"--exclude-gpus {config.exclude_gpus}: excludes every GPU of this node", EXIT_CONFIG
            )
        mig = _mig_cards(config, backend, gpus)
        topology = backend.topology(gpus)
        if topology is not None:
            log.info("gpu topology", topology=topology.encode())
        health = HealthState(tuple(gpu.uuid for gpu in gpus))
        monitor = HealthMonitor(
            backend, health, XidPolicy.from_env(env), config.health_recovery_period, supervisor=supervisor
        )
        monitor.start()
        mps = _mps_daemons(config, gpus, health, supervisor)
        if mps is not None:
            mps.start()  # after the monitor: both mark the same health
        return cls(backend, gpus, health, monitor, mig, mps, topology)

    def stop(self) -> None:
        if self.mps is not None:
            self.mps.stop()
        self.monitor.stop()
        self.backend.close()


@dataclass
class KubeSide:
    """Pod cache, events, node state and the outbox: everything that talks to the API server. The
    daemon serves kubelet with or without it, and all of it retries on its own while the API is down."""

    kube: Kube
    pods: PodCache
    events: EventRecorder
    watch: NodeWatch
    node: NodePublisher
    outbox: OutboxWorker
    health: HealthState
    on_health: Callable[[str, bool, str], None]
    ledger: Ledger
    on_ledger: StorageListener
    handshake: Handshake | None = None
    started: bool = False  # built, its parts not running yet (a client that failed to load)

    @staticmethod
    def connect(config: DaemonConfig, env: Mapping[str, str], *, load: bool) -> Kube | None:
        """The API facade, its client loaded now when `load` (else by `start`), or None when no API
        is configured (a warning, not an error)."""
        if config.kubeconfig is None and not env.get("KUBERNETES_SERVICE_HOST"):
            log.warning("no Kubernetes API (--kubeconfig, or run in a pod): pods and node state not followed")
            return None
        return Kube(_load_client(config) if load else None)

    @classmethod
    def build(
        cls,
        kube: Kube,
        config: DaemonConfig,
        gpu: GpuSide,
        layout: Layout,
        ledger: Ledger,
        *,
        family: NodeFamily,
        supervisor: Supervisor,
    ) -> KubeSide:
        pods = PodCache(kube, config.node_name, supervisor=supervisor, slim=daemon_pod)
        events = EventRecorder(kube, config.node_name, supervisor)
        watch = NodeWatch(kube, config.node_name, supervisor)  # shared by node state and the handshake
        node = NodePublisher(
            kube,
            watch,
            lambda: with_topology(
                family.node_state(gpu.gpus, gpu.health.snapshot()[1], layout), gpu.topology
            ),
            gpu.health,
            config.node_resync_interval,
            supervisor=supervisor,
        )
        # made before the cache starts, which it follows
        outbox = OutboxWorker(ledger, kube, pods, supervisor)
        index = {g.uuid: g.index for g in gpu.gpus}
        about = Involved.node(config.node_name, uid=config.node_name)  # kubelet's convention for node events

        def on_health(uuid: str, healthy: bool, reason: str) -> None:
            message = (
                f"GPU {index.get(uuid)} ({uuid}) is {'healthy again' if healthy else 'unhealthy'}: {reason}"
            )
            if healthy:
                events.normal(about, "GpuHealthy", message)
            else:
                events.warning(about, "GpuUnhealthy", message)

        gpu.health.add_listener(on_health)

        def on_ledger(problem: StorageError | None) -> None:
            if problem is None:
                events.normal(about, "LedgerWritable", f"the ledger {ledger.path} is written again")
            else:
                events.warning(about, "LedgerUnwritable", f"GPU allocation on this node stops: {problem}")

        ledger.add_listener(on_ledger)
        resources = tuple(resource.name for resource in family.resources)

        def on_rejected(pod: Mapping[str, Any], reason: str) -> None:
            if asks_for(pod, resources):  # its owner waits for GPUs: say why none come
                message = f"pod not served on node {config.node_name}: {reason}"
                events.warning(Involved.pod(pod), "GpuPodRejected", message)

        pods.rejections.add_hook(on_rejected)
        handshake = None
        if family.answers_handshake:  # answering Volcano's requests needs no flag
            handshake = Handshake(
                kube,
                watch,
                config.vgpu_handshake_interval,
                heartbeat=config.vgpu_handshake,
                supervisor=supervisor,
            )
        return cls(
            kube, pods, events, watch, node, outbox, gpu.health, on_health, ledger, on_ledger, handshake
        )

    def start(self, config: DaemonConfig) -> None:
        """Load the client if `connect` did not, then start following the API server."""
        if self.kube.client is None:
            self.kube.client = _load_client(config)
        for part in (self.pods, self.events, self.node, self.outbox, self.handshake, self.watch):
            if part is not None:
                part.start()
        self.started = True

    def stop(self) -> None:
        self.health.remove_listener(self.on_health)
        self.ledger.remove_listener(self.on_ledger)
        if not self.started:
            return
        for part in (self.watch, self.handshake, self.node, self.outbox, self.pods, self.events):
            if part is not None:
                part.stop()


NO_API = (
    grpc.StatusCode.FAILED_PRECONDITION,
    "no Kubernetes API configured (--kubeconfig, or run in a pod): an Allocate cannot be matched to its pod",
)


def _allocator(
    config: DaemonConfig, family: NodeFamily, devices: DeviceList, gpu: GpuSide, services: Services
) -> Allocator | None:
    """What answers Allocate for the resource (the family's choice); None without an API."""
    kube = services.kube
    api = None
    if kube is not None:
        options = {
            "node_name": config.node_name,
            "id_strategy": config.device_id_strategy,
            "timeout_s": config.allocate_timeout,
            "stats": services.stats,
            "on_outbox": kube.outbox.wake,
            "pod_resources": config.pod_resources_socket,  # tells apart pods asking the same count
        }
        api = PodApi(kube.pods, kube.events, options)
    parts = AllocatorParts(
        gpu.health,
        services.ledger,
        services.stats,
        services.hook,
        config.vgpu_disable_core_limit,
        api,
        gpu.mig,
        gpu.mps,
        gpu.topology,
    )
    allocator = family.allocator(devices, parts)
    if isinstance(allocator, PodAllocator) and services.releaser is not None:
        services.releaser.add_reconciler(allocator)  # kubelet's records correct a pod served as another
    return allocator


def _service(
    config: DaemonConfig, family: NodeFamily, devices: DeviceList, gpu: GpuSide, services: Services
) -> DevicePluginService:
    allocator = _allocator(config, family, devices, gpu, services)
    fault = services.supervisor.inject  # the test hook: makes the calls its file names raise
    if allocator is None:
        return DevicePluginService(devices, gpu.health, unavailable=NO_API, fault=fault)
    return DevicePluginService(devices, gpu.health, allocator, fault=fault)


def _nothing_held(pod_resources: Path, resources: Collection[str]) -> bool:
    """Kubelet's pod-resources `List` shows no container holding one of `resources`; False when
    it does not answer (a rebuild then waits for one that does)."""
    try:
        return not read_listing(pod_resources, NOTHING_HELD_TIMEOUT_S).holds_any(resources)
    except grpc.RpcError:
        return False


@dataclass
class Services:
    """Everything a reload rebuilds: the API side (when configured), the release loop and the
    kubelet-facing plugins."""

    ledger: Ledger
    stats: AllocationStats
    hook: HookPath
    supervisor: Supervisor  # the daemon's: restart counts outlive a reload
    kube: KubeSide | None = None
    releaser: Releaser | None = None
    registrar: Registrar | None = None

    def _drop_unmounted_cache_dirs(self) -> None:
        if self.ledger.replaced is not None or (self.ledger.created and self.hook.found_dirs):
            return  # a container whose row could not be rebuilt may still use its directory
        self.hook.keep_mounted(allocation.response for allocation in self.ledger.active())

    def _rebuilder(self, config: DaemonConfig, resources: Collection[str]) -> Rebuild | None:
        """How the release loop rebuilds a ledger `Ledger.open` replaced, or found missing (None:
        nothing to rebuild). A missing ledger needs no rebuild when kubelet shows no container
        holding `resources` (the rebuild works from that listing): the API, read for a rebuild
        before the first Register, can then wait until after it, as on a restart."""
        replaced, kube = self.ledger.replaced, self.kube
        if replaced is None and not self.ledger.created:
            return None
        if kube is None:
            if replaced is None:
                return None  # nothing can be read; a new node's ledger is new anyway
            log.warning(
                "ledger not rebuilt: without the Kubernetes API no pod can be read", moved_to=str(replaced)
            )
            return None
        if replaced is None and _nothing_held(config.pod_resources_socket, resources):
            log.info("ledger new: kubelet shows no container holding the node's devices, nothing to rebuild")
            return None
        about = Involved.node(config.node_name, uid=config.node_name)

        def report(message: str) -> None:
            kube.events.warning(about, "LedgerRebuilt", message)

        return lambda listing, allocators: rebuild_ledger(replaced, listing, allocators, report)

    def _on_released(self, _pod_uid: str) -> None:
        # By what live rows mount, not by UID: a corrected swap leaves a pod's container using the
        # directory created under the other pod's UID.
        self._drop_unmounted_cache_dirs()

    def start(self, config: DaemonConfig, api: Kube | None, gpu: GpuSide, layout: Layout) -> None:
        try:
            config.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StartupError(
                f"--device-plugin-dir {config.device_plugin_dir}: {err.strerror}", EXIT_CONFIG
            ) from None
        # chosen once per start (a reload starts anew)
        family = node_family_of(config.gpu_strategy, config.vgpu_mode)
        if family.uses_hook:
            try:
                self.hook.prepare()
            except OSError as err:
                raise StartupError(f"--hook-path {self.hook.root}: {err}", EXIT_CONFIG) from None
            self._drop_unmounted_cache_dirs()
        self.kube = (
            None
            if api is None
            else KubeSide.build(
                api, config, gpu, layout, self.ledger, family=family, supervisor=self.supervisor
            )
        )
        rebuild = self._rebuilder(config, [resource.name for resource in family.resources])
        # The API side starts after the first Register (loading the client imports the kubernetes
        # package: most of the start-up time, bench/startup.py): kubelet lists the devices
        # meanwhile, and an Allocate waits for its pod as it does on a cache not yet synced. Not
        # when a ledger must be rebuilt: that reads the API, and must end before kubelet calls.
        if self.kube is not None and rebuild is not None:
            self._start_kube(self.kube, config)
        self.releaser = Releaser(
            self.ledger,
            self.kube.pods if self.kube else None,
            config.pod_resources_socket,
            interval_s=config.reconcile_interval,
            grace_s=config.release_grace_period,
            on_released=self._on_released if family.uses_hook else lambda _uid: None,
            supervisor=self.supervisor,
            rebuild=rebuild,
        )
        servers = [
            PluginServer(
                _service(config, family, DeviceList(resource, gpu.gpus, layout), gpu, self),
                config.device_plugin_dir,
            )
            for resource in family.resources
        ]
        self.releaser.start()  # after the allocators joined it (a rebuild needs them), before kubelet calls
        self.registrar = Registrar(
            servers,
            config.kubelet_socket,
            on_registered=self.kube.node.recheck if self.kube else None,
            supervisor=self.supervisor,
        )
        try:
            self.registrar.start()
        except (OSError, RuntimeError, grpc.RpcError) as err:
            self.stop()
            raise StartupError(f"cannot serve in {config.device_plugin_dir}: {err}") from None
        if self.kube is not None and rebuild is None:
            self._start_kube(self.kube, config)

    def _start_kube(self, kube: KubeSide, config: DaemonConfig) -> None:
        try:
            kube.start(config)
        except StartupError:
            self.stop()
            raise

    def stop(self) -> None:
        for part in (self.registrar, self.releaser, self.kube):
            if part is not None:
                part.stop()
        self.registrar = self.releaser = self.kube = None


def _layout(config: DaemonConfig, gpu: GpuSide) -> Layout:
    try:
        return choose_layout(config, gpu.gpus)
    except FactorError as err:
        raise StartupError(str(err), EXIT_CONFIG) from None


def _load_client(config: DaemonConfig) -> kubernetes.client.ApiClient:
    try:
        return load_client(config.kubeconfig)
    except ConfigError as err:
        raise StartupError(str(err), EXIT_CONFIG) from None


def _open_ledger(config: DaemonConfig) -> Ledger:
    try:
        return Ledger.open(config.state_dir / "ledger.db")
    except StorageError as err:
        raise StartupError(f"--state-dir {config.state_dir}: {err}") from None
    except (LedgerError, OSError) as err:
        raise StartupError(f"--state-dir {config.state_dir}: {err}", EXIT_CONFIG) from None


def configure_logging(config: DaemonConfig) -> None:
    logs.configure(config.log_format, getattr(logging, config.log_level.upper()))


def _backend_settings(config: DaemonConfig) -> tuple[object, ...]:
    mig, mps = config.vgpu_mode == keys.MODE_MIG, config.vgpu_mode == keys.MODE_MPS  # vGPU nodes only
    return (
        config.fake_gpus,
        config.fake_gpu_events,
        config.fake_gpu_topology,
        config.health_recovery_period,
        config.exclude_gpus,
        (config.vgpu_mig_geometries,) if mig else None,  # the MIG cards are checked at GpuSide.start
        (config.mps_root, config.mps_control, config.mps_sidecar) if mps else None,  # its daemons too
    )


class Daemon:
    """Owns the running parts; `reload` swaps in a new configuration."""

    def __init__(self, config: DaemonConfig, env: Mapping[str, str]) -> None:
        self.config = config
        self.env = env
        self.stats = AllocationStats()
        self.supervisor = Supervisor.from_env(env)  # every background worker, for readiness and /metrics
        self.gpu = GpuSide.start(config, env, self.supervisor)
        try:
            self.layout = _layout(config, self.gpu)
            self.api = KubeSide.connect(config, env, load=False)  # loaded once registered
            self.services = Services(
                _open_ledger(config), self.stats, HookPath(config.hook_path), self.supervisor
            )
            self.services.start(config, self.api, self.gpu, self.layout)
        except BaseException:
            self.gpu.stop()
            raise

    def reload(self, config: DaemonConfig) -> None:
        """Apply a new configuration: plugins are re-served and re-registered; GPUs are
        re-enumerated (losing health history) only when the GPU source itself changed. A
        configuration that cannot start leaves the running one in place."""
        if config == self.config:
            log.info("configuration unchanged")
            return
        changed_source = _backend_settings(config) != _backend_settings(self.config)
        gpu = GpuSide.start(config, self.env, self.supervisor) if changed_source else self.gpu
        try:
            layout = _layout(config, gpu)
            api = KubeSide.connect(config, self.env, load=True)  # a bad one keeps the running one
            ledger = (
                _open_ledger(config) if config.state_dir != self.config.state_dir else self.services.ledger
            )
        except StartupError:
            if changed_source:
                gpu.stop()
            raise
        self.services.stop()
        services = Services(ledger, self.stats, HookPath(config.hook_path), self.supervisor)
        try:
            services.start(config, api, gpu, layout)
        except StartupError:
            self.services.start(self.config, self.api, self.gpu, self.layout)
            if changed_source:
                gpu.stop()
            if ledger is not self.services.ledger:
                ledger.close()
            raise
        if changed_source:
            self.gpu.stop()
        if ledger is not self.services.ledger:
            self.services.ledger.close()
        self.config, self.gpu, self.layout, self.api, self.services = config, gpu, layout, api, services
        configure_logging(config)
        log.info("configuration reloaded")

    def stop(self) -> None:
        self.services.stop()
        self.services.ledger.close()
        self.gpu.stop()

    def snapshot(self) -> DaemonSnapshot:
        """What the daemon reports about itself now (`/metrics` reads only this)."""
        # Imported at the first scrape, after the daemon registered with kubelet (bench/startup.py).
        from deviceplugin.plugin.snapshot import (  # noqa: PLC0415
            AllocateCounts,
            ApiSide,
            DaemonSnapshot,
            GpuSnapshot,
            LedgerCounts,
            PodOnGpu,
        )

        services, gpu, stats, layout = self.services, self.gpu, self.stats, self.layout
        ledger = services.ledger
        _, health = gpu.health.snapshot()
        usage = {row.uuid: row for row in ledger.usage_by_gpu()}
        mode = node_family_of(self.config.gpu_strategy, self.config.vgpu_mode).mode
        gpus = tuple(
            GpuSnapshot(
                info.uuid,
                info.index,
                bool(health.get(info.uuid)),
                layout.vgpu_memory_units(info),
                used.pods if used else 0,
                layout.units(used.memory) if used else 0,
                used.cores if used else 0,
                mode,
            )
            for info in gpu.gpus
            for used in (usage.get(info.uuid),)
        )
        pods = tuple(
            PodOnGpu(row.uuid, row.pod_name, row.namespace, layout.units(row.memory), row.cores)
            for row in ledger.usage_by_pod()
        )
        registrar, kube = services.registrar, services.kube
        api = None
        if kube is not None:
            api = ApiSide(
                kube.pods.staleness_s(),
                rejected_by_kind((kube.pods, kube.watch)),
                dict(kube.outbox.batches),
                dict(kube.outbox.entries),
            )
        return DaemonSnapshot(
            node_name=self.config.node_name,
            gpus=gpus,
            pods=pods,
            xid_events=dict(gpu.monitor.xid_events),
            allocate=AllocateCounts(
                dict(stats.failures),
                dict(stats.mismatches),
                dict(stats.resolved),
                dict(stats.swaps),
                stats.waiting(),
            ),
            listandwatch_bytes={
                server.resource_name: len(server.service.devices.message(health))
                for server in (registrar.servers if registrar is not None else ())
            },
            registrations=dict(registrar.registrations) if registrar is not None else {},
            ledger=LedgerCounts(ledger.live_count(), ledger.outbox_size(), dict(ledger.storage_errors)),
            api=api,
            worker_restarts=self.supervisor.restarts(),
            api_errors=dict(self.api.errors) if self.api is not None else None,
        )
