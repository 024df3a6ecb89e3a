"""`deviceplugin run`: the node daemon as a process: signals, reloads and the metrics listener."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping
from types import FrameType
from typing import TYPE_CHECKING

from deviceplugin import logs, memory
from deviceplugin.config import DaemonConfig, load_config
from deviceplugin.options import OptionError
from deviceplugin.plugin.daemon import EXIT_FAILED, Daemon, StartupError, configure_logging

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from deviceplugin.httpserver import HttpStats
    from deviceplugin.metrics import MetricsServer

log = logs.get_log(__name__)


def _serve_metrics(daemon: Daemon, registry: CollectorRegistry, stats: HttpStats) -> MetricsServer:
    from deviceplugin.metrics import MetricsServer  # noqa: PLC0415  # after registering: see run()

    address = daemon.config.metrics_address
    try:
        server = MetricsServer(daemon, address, registry, stats)
    except OSError as err:
        raise StartupError(f"--metrics-address {address}: {err.strerror or err}", EXIT_FAILED) from None
    server.start()
    return server


def _log_notes(config: DaemonConfig) -> None:
    """What the upstream config files hold that this daemon reads but has nothing to do for."""
    for note in config.notes:
        log.info("upstream config", note=note)


def run(flags: Mapping[str, str | None], env: Mapping[str, str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; SIGHUP reloads the configuration. Returns the exit code."""
    env = dict(os.environ if env is None else env)
    config = load_config(flags, env)
    configure_logging(config)
    _log_notes(config)
    memory.return_large_buffers_to_the_os()
    stop, reload = threading.Event(), threading.Event()

    def on_signal(number: int, frame: FrameType | None) -> None:
        (reload if number == signal.SIGHUP else stop).set()

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, on_signal)
    try:
        daemon = Daemon(config, env)
    except StartupError as err:
        log.error("cannot start", error=str(err))
        return err.exit_code
    # Imported once Daemon has started registering with kubelet: the metrics listener's modules
    # (prometheus_client, the HTTP server: ~15 ms) are not what kubelet should wait for
    # (bench/startup.py).
    from deviceplugin.httpserver import HttpCollector, HttpStats  # noqa: PLC0415
    from deviceplugin.metrics import PLUGIN, registry_for  # noqa: PLC0415

    registry = registry_for(daemon)
    http = HttpStats()  # one count across the listeners a reload may move to
    registry.register(HttpCollector(PLUGIN, http))
    try:
        metrics = _serve_metrics(daemon, registry, http)
    except StartupError as err:
        log.error("cannot start", error=str(err))
        daemon.stop()
        return err.exit_code
    log.info("started", node=config.node_name, strategy=config.gpu_strategy, gpus=len(daemon.gpu.gpus))
    memory.freeze_startup_objects()
    while not stop.wait(0.2):
        if reload.is_set():
            reload.clear()
            metrics = _reload(daemon, flags, metrics, registry, http)
    metrics.stop()
    daemon.stop()
    log.info("stopped")
    return 0


def _reload(
    daemon: Daemon,
    flags: Mapping[str, str | None],
    metrics: MetricsServer,
    registry: CollectorRegistry,
    http: HttpStats,
) -> MetricsServer:
    """Apply the configuration as it reads now; the metrics listener moves if its address changed."""
    address = daemon.config.metrics_address
    try:
        daemon.reload(load_config(flags, dict(os.environ)))
    except (OptionError, StartupError) as err:
        log.error("reload refused, keeping the running configuration", error=str(err))
        return metrics
    _log_notes(daemon.config)
    if daemon.config.metrics_address == address:
        metrics.configure(daemon.config)
        return metrics
    try:  # bind the new address before letting go of the old one
        moved = _serve_metrics(daemon, registry, http)
    except StartupError as err:
        log.error("metrics listener not moved, still on the old address", address=address, error=str(err))
        return metrics
    metrics.stop()
    return moved
