"""The daemon's stats snapshot (issue 14 item 3), what `/metrics` renders: the real daemon in this
process with fake GPUs, registered with the kubelet emulator over its Unix socket, no API server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from deviceplugin.config import load_config
from deviceplugin.metrics import registry_for
from deviceplugin.plugin.daemon import Daemon
from kubesim.kubelet import KubeletEmulator
from tests.daemons import GPU0, GPU1, TIMEOUT_S, streaming
from tests.kube.waiting import wait_for


@pytest.fixture
def daemon(workdir: Path, kubelet: KubeletEmulator) -> Iterator[Daemon]:
    config = load_config(
        {
            "node-name": "node-1",
            "gpu-strategy": "vgpu",
            "fake-gpus": "2x4000",
            "gpu-memory-factor": "10",
            "device-plugin-dir": str(workdir / "plugins"),
            "pod-resources-socket": str(workdir / "pod-resources.sock"),
            "state-dir": str(workdir / "state"),
        },
        {},
    )
    running = Daemon(config, {})
    yield running
    running.stop()


def test_the_snapshot_holds_what_metrics_shows(daemon: Daemon, kubelet: KubeletEmulator) -> None:
    assert kubelet.wait_for(streaming("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory"), TIMEOUT_S)
    # kubelet may see a plugin's stream before the daemon has recorded that registration
    assert wait_for(lambda: len(daemon.snapshot().registrations) >= 2, TIMEOUT_S)
    taken = daemon.snapshot()
    assert taken.node_name == "node-1"
    assert [(gpu.uuid, gpu.index, gpu.healthy, gpu.memory_limit) for gpu in taken.gpus] == [
        (GPU0, 0, True, 400),  # 4000 MiB in units of the memory factor, as registered
        (GPU1, 1, True, 400),
    ]
    assert [(gpu.pods, gpu.memory, gpu.cores) for gpu in taken.gpus] == [(0, 0, 0), (0, 0, 0)]
    assert set(taken.registrations) >= {"volcano.sh/vgpu-number", "volcano.sh/vgpu-memory"}
    assert all(size > 0 for size in taken.listandwatch_bytes.values())
    assert (taken.ledger.allocations, taken.ledger.outbox_backlog) == (0, 0)
    assert taken.api is None and taken.api_errors is None  # no API server: no API-side series


def test_a_snapshot_does_not_change_once_taken(daemon: Daemon) -> None:
    """A scrape renders one moment: a GPU failing while it renders shows in the next scrape only."""
    before = daemon.snapshot()
    daemon.gpu.health.set((GPU1,), False, "test: Xid 79")
    daemon.stats.failures["no-pod"] += 1  # as a refused Allocate counts itself
    after = daemon.snapshot()
    assert [gpu.healthy for gpu in before.gpus] == [True, True]
    assert [gpu.healthy for gpu in after.gpus] == [True, False]
    assert (before.allocate.failures, after.allocate.failures) == ({}, {"no-pod": 1})


@pytest.mark.parametrize(("strategy", "mode"), [("vgpu", "hami-core"), ("share", "share")])
def test_metrics_show_how_each_gpu_is_shared(workdir: Path, strategy: str, mode: str) -> None:
    settings = {
        "node-name": "node-1",
        "gpu-strategy": strategy,
        "fake-gpus": "2x4000",
        "device-plugin-dir": str(workdir / "plugins"),
        "pod-resources-socket": str(workdir / "pod-resources.sock"),
        "state-dir": str(workdir / "state"),
    }
    running = Daemon(load_config(settings, {}), {})
    try:
        text = generate_latest(registry_for(running)).decode()
    finally:
        running.stop()
    for uuid, index in ((GPU0, 0), (GPU1, 1)):
        assert f'volcano_gpu_plugin_device_mode{{devID="{uuid}",index="{index}",mode="{mode}"}} 1.0' in text


def test_allocates_made_before_the_metrics_start_are_in_the_latency_histogram(daemon: Daemon) -> None:
    """The metrics (and their histogram) start after the first Register, and kubelet may call at
    once: those first calls were missing from `allocate_duration_seconds` (a scrape then counted
    4 of 5 served Allocates)."""
    daemon.stats.record("volcano.sh/vgpu-number", "served", 0.002)
    daemon.stats.record("volcano.sh/vgpu-memory", "empty", 0.0005)
    registry = registry_for(daemon)
    daemon.stats.record("volcano.sh/vgpu-number", "served", 0.003)
    text = generate_latest(registry).decode()
    metric = "volcano_gpu_plugin_allocate_duration_seconds"
    number, memory = 'resource="volcano.sh/vgpu-number"', 'resource="volcano.sh/vgpu-memory"'
    assert f'{metric}_count{{outcome="served",{number}}} 2.0' in text
    assert f'{metric}_count{{outcome="empty",{memory}}} 1.0' in text
    assert f'{metric}_sum{{outcome="served",{number}}} 0.005' in text
