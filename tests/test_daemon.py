"""The node daemon as a user runs it: a real subprocess, registering with the kubelet emulator over
real Unix sockets (SPEC §1, §2, §6, §10). Timeouts here are generous upper bounds for a loaded CI
machine; the latency figures themselves are measured in bench/daemon.py."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kubesim.kubelet import KubeletEmulator
from tests.daemons import GPU0, GPU1, TIMEOUT_S, VGPU, Daemon, eventually, inject, state, streaming, wait
from tests.e2e.test_vgpu import samples


def health_of(kubelet: KubeletEmulator, name: str, uuid_or_index: str) -> set[str]:
    return {
        h
        for device, h in state(kubelet, name).devices.items()
        if device.startswith(f"{uuid_or_index}-") or device == uuid_or_index
    }


# --- registration and device lists ---------------------------------------------------------


def test_share_registers_one_device_per_mib(kubelet: KubeletEmulator, start: Callable[..., Daemon]) -> None:
    daemon = start("--fake-gpus", "2x10989", "--gpu-strategy", "share")
    wait(kubelet, streaming("volcano.sh/gpu-memory"), daemon)
    memory = state(kubelet, "volcano.sh/gpu-memory")
    assert memory.endpoint == "volcano.sock"
    assert set(memory.devices) == {f"{gpu}-{unit}" for gpu in (0, 1) for unit in range(10989)}
    assert (memory.capacity, memory.allocatable) == (21978, 21978)
    assert all(topology == () for topology in memory.topology.values())
    (registration,) = kubelet.registrations
    assert registration.ok and registration.version == "v1beta1"
    # The same options in Register and GetDevicePluginOptions.
    assert registration.register_options == registration.plugin_options
    assert registration.plugin_options is not None
    assert registration.plugin_options.get_preferred_allocation_available
    assert not registration.plugin_options.pre_start_required


def test_number_registers_gpu_uuids_with_numa(
    kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    spec = workdir / "gpus.json"
    spec.write_text(
        json.dumps(
            [
                {"uuid": "GPU-aaaa-0", "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "numa": 0},
                {"uuid": "GPU-aaaa-1", "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "numa": 1},
                {"uuid": "GPU-aaaa-2", "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "numa": None},
            ]
        )
    )
    daemon = start("--fake-gpus", str(spec), "--gpu-strategy", "number")
    wait(kubelet, streaming("volcano.sh/gpu-number"), daemon)
    number = state(kubelet, "volcano.sh/gpu-number")
    assert dict(number.devices) == {"GPU-aaaa-0": "Healthy", "GPU-aaaa-1": "Healthy", "GPU-aaaa-2": "Healthy"}
    assert dict(number.topology) == {"GPU-aaaa-0": (0,), "GPU-aaaa-1": (1,), "GPU-aaaa-2": ()}


def test_vgpu_registers_three_resources(kubelet: KubeletEmulator, start: Callable[..., Daemon]) -> None:
    daemon = start("--fake-gpus", "2x10989", "--gpu-strategy", "vgpu", "--vgpu-split-count", "4")
    wait(kubelet, streaming(*VGPU), daemon)
    number, memory, cores = (state(kubelet, name) for name in VGPU)
    assert (number.endpoint, memory.endpoint, cores.endpoint) == (
        "nvidia-vgpu-number.sock",
        "nvidia-vgpu-memory.sock",
        "nvidia-vgpu-cores.sock",
    )
    assert set(number.devices) == {f"{g}-{i}" for g in (GPU0, GPU1) for i in range(4)}
    assert set(memory.devices) == {f"{g}-memory-{i}" for g in (GPU0, GPU1) for i in range(10989)}
    assert set(cores.devices) == {f"{g}-core-{i}" for g in (GPU0, GPU1) for i in range(100)}
    assert sorted(r.resource for r in kubelet.registrations) == sorted(VGPU)


@pytest.mark.parametrize(
    ("strategy", "resource", "per_gpu"),
    [
        ("share", "volcano.sh/gpu-memory", 143771 // 7),
        ("vgpu", "volcano.sh/vgpu-memory", 143771 // 21),
    ],
)
def test_auto_factor_keeps_eight_h200_under_the_limit(
    kubelet: KubeletEmulator, start: Callable[..., Daemon], strategy: str, resource: str, per_gpu: int
) -> None:
    daemon = start("--fake-gpus", "8x143771", "--gpu-strategy", strategy, "--gpu-memory-factor", "auto")
    wait(kubelet, streaming(resource), daemon)
    memory = state(kubelet, resource)
    assert memory.capacity == 8 * per_gpu
    assert memory.stream_error is None
    assert memory.last_message_bytes < 3.5 * 1024 * 1024
    assert f"factor={143771 // per_gpu}" in daemon.output()


# --- kubelet restarts ----------------------------------------------------------------------


def test_kubelet_restart_is_followed_by_re_registration(
    kubelet: KubeletEmulator, start: Callable[..., Daemon]
) -> None:
    def registered_anew(k: KubeletEmulator) -> bool:
        # Kubelet records a registration after the plugin's stream has opened: streaming alone
        # does not say the record is there yet.
        since = k.socket_created_at or 0
        return {r.resource for r in k.registrations if r.ok and r.at >= since} == set(VGPU)

    daemon = start("--fake-gpus", "2x1000", "--gpu-strategy", "vgpu")
    wait(kubelet, streaming(*VGPU), daemon)
    for restart in (1, 2):
        kubelet.restart()
        wait(
            kubelet,
            lambda k, n=restart: k.restarts == n and streaming(*VGPU)(k) and registered_anew(k),  # type: ignore[misc]
            daemon,
        )
        assert all(state(kubelet, name).allocatable > 0 for name in VGPU)


def test_registers_when_kubelet_appears_later(workdir: Path, start: Callable[..., Daemon]) -> None:
    daemon = start("--fake-gpus", "1x1000")
    eventually(lambda: "waiting for kubelet" in daemon.output(), daemon)  # serving, nothing answers
    assert daemon.process.poll() is None
    with KubeletEmulator(workdir / "plugins") as kubelet:
        wait(kubelet, streaming("volcano.sh/gpu-memory"), daemon)
        assert state(kubelet, "volcano.sh/gpu-memory").capacity == 1000


def test_socket_is_private_and_removed_on_sigterm(
    kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    daemon = start("--fake-gpus", "2x100", "--gpu-strategy", "vgpu")
    wait(kubelet, streaming(*VGPU), daemon)
    sockets = [
        workdir / "plugins" / name
        for name in ("nvidia-vgpu-number.sock", "nvidia-vgpu-memory.sock", "nvidia-vgpu-cores.sock")
    ]
    for path in sockets:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert daemon.stop() == 0
    assert not any(path.exists() for path in sockets)
    assert (workdir / "plugins" / "kubelet.sock").exists()  # kubelet's own socket is not ours to remove
    wait(kubelet, lambda k: not any(state(k, name).connected for name in VGPU), daemon)
    assert "stopped" in daemon.output()


def test_stale_socket_is_replaced(
    kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    (workdir / "plugins" / "volcano.sock").write_text("left over by a crashed daemon")
    daemon = start("--fake-gpus", "1x100")
    wait(kubelet, streaming("volcano.sh/gpu-memory"), daemon)
    assert stat.S_ISSOCK((workdir / "plugins" / "volcano.sock").stat().st_mode)


# --- health --------------------------------------------------------------------------------


@pytest.fixture
def vgpu_daemon(kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path) -> tuple[Daemon, Path]:
    events = workdir / "events.jsonl"
    daemon = start(
        "--fake-gpus",
        "2x1000",
        "--fake-gpu-events",
        str(events),
        "--gpu-strategy",
        "vgpu",
        "--health-recovery-period",
        "1",
    )
    wait(kubelet, streaming(*VGPU), daemon)
    return daemon, events


def all_ids(kubelet: KubeletEmulator, uuid: str, health: str) -> Callable[[KubeletEmulator], bool]:
    return lambda k: all(health_of(k, name, uuid) == {health} for name in VGPU)


def test_critical_xid_makes_every_id_of_that_gpu_unhealthy_then_it_recovers(
    kubelet: KubeletEmulator, vgpu_daemon: tuple[Daemon, Path]
) -> None:
    daemon, events = vgpu_daemon
    inject(events, xid=79, uuid=GPU1)
    wait(kubelet, all_ids(kubelet, GPU1, "Unhealthy"), daemon)
    assert all(health_of(kubelet, name, GPU0) == {"Healthy"} for name in VGPU)
    assert state(kubelet, "volcano.sh/vgpu-memory").allocatable == 1000
    # quiet for the recovery period and the probe passes: back to Healthy
    wait(kubelet, all_ids(kubelet, GPU1, "Healthy"), daemon)


def test_application_xid_is_ignored(kubelet: KubeletEmulator, vgpu_daemon: tuple[Daemon, Path]) -> None:
    daemon, events = vgpu_daemon
    before = {name: state(kubelet, name).messages for name in VGPU}
    inject(events, xid=31, uuid=GPU0)
    inject(events, xid=48, uuid=GPU1)  # a marker the daemon does act on, so we know 31 was read first
    wait(kubelet, all_ids(kubelet, GPU1, "Unhealthy"), daemon)
    assert all(health_of(kubelet, name, GPU0) == {"Healthy"} for name in VGPU)
    assert all(state(kubelet, name).messages == before[name] + 1 for name in VGPU)
    assert "xid ignored" in daemon.output()


def test_lost_gpu_stays_unhealthy_until_it_answers(
    kubelet: KubeletEmulator, vgpu_daemon: tuple[Daemon, Path]
) -> None:
    daemon, events = vgpu_daemon
    inject(events, lost=GPU0)
    inject(events, xid=79, uuid=GPU0)
    wait(kubelet, all_ids(kubelet, GPU0, "Unhealthy"), daemon)
    # Past the 1 s recovery period the probe runs, and fails: still unhealthy.
    eventually(
        lambda: any(
            "probe failed" in line and f"gpu={GPU0}" in line for line in daemon.output().splitlines()
        ),
        daemon,
    )
    assert all(health_of(kubelet, name, GPU0) == {"Unhealthy"} for name in VGPU)
    inject(events, restore=GPU0)
    wait(kubelet, all_ids(kubelet, GPU0, "Healthy"), daemon)


def test_failed_event_wait_fences_every_gpu(
    kubelet: KubeletEmulator, vgpu_daemon: tuple[Daemon, Path]
) -> None:
    daemon, events = vgpu_daemon
    inject(events, wait_error="GPU is lost")
    wait(kubelet, lambda k: all(state(k, name).allocatable == 0 for name in VGPU), daemon)
    assert "event wait failed: GPU is lost" in daemon.output()
    wait(
        kubelet, lambda k: all(state(k, name).allocatable == state(k, name).capacity for name in VGPU), daemon
    )


def test_disabled_health_checks_ignore_critical_xids(
    kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    events = workdir / "events.jsonl"
    daemon = start(
        "--fake-gpus", "1x100", "--fake-gpu-events", str(events), env={"DP_DISABLE_HEALTHCHECKS": "all"}
    )
    wait(kubelet, streaming("volcano.sh/gpu-memory"), daemon)
    assert "xid health checks disabled" in daemon.output()
    # No health worker runs (a started worker is listed from its start): nothing reads Xid events.
    workers = samples(daemon, "volcano_gpu_plugin_worker_restarts_total")
    assert (("worker", "registrar"),) in workers and (("worker", "gpu-health"),) not in workers
    inject(events, xid=79, uuid=GPU0)
    assert state(kubelet, "volcano.sh/gpu-memory").allocatable == 100


# --- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fake-gpus", "1x100", "--gpu-memory-factor", "0"], "--gpu-memory-factor: invalid value '0'"),
        (["--fake-gpus", "1x100", "--gpu-strategy", "mps"], "--gpu-strategy: invalid value 'mps'"),
        (["--fake-gpus", "two-gpus"], "--fake-gpus 'two-gpus'"),
        (["--fake-gpus", "/nonexistent/gpus.json"], "--fake-gpus '/nonexistent/gpus.json'"),
        (["--fake-gpus", "8x143771", "--gpu-memory-factor", "2"], "use --gpu-memory-factor=7 or more"),
        (["--fake-gpus", "1x100", "--no-such-flag", "1"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_configuration_exits_non_zero_naming_the_option(
    workdir: Path, args: list[str], message: str
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "deviceplugin.cli",
            "run",
            "--node-name",
            "n",
            "--device-plugin-dir",
            str(workdir / "plugins"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


def test_missing_node_name(workdir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    done = subprocess.run(
        [sys.executable, "-m", "deviceplugin.cli", "run", "--fake-gpus", "1x100"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        env=env,
    )
    assert done.returncode == 2
    assert "--node-name (or env NODE_NAME) is required" in done.stderr


def test_sighup_reloads_the_config_file(
    kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    config = workdir / "config.yaml"
    config.write_text("gpu-strategy: vgpu\nvgpu-split-count: 2\n")
    daemon = start("--fake-gpus", "2x100", "--config", str(config))
    wait(kubelet, lambda k: streaming(*VGPU)(k) and state(k, VGPU[0]).capacity == 4, daemon)
    config.write_text("gpu-strategy: vgpu\nvgpu-split-count: 5\n")
    daemon.process.send_signal(signal.SIGHUP)
    wait(kubelet, lambda k: streaming(*VGPU)(k) and state(k, VGPU[0]).capacity == 10, daemon)
    config.write_text("gpu-strategy: vgpu\nvgpu-split-count: zero\n")  # a bad reload keeps the running config
    daemon.process.send_signal(signal.SIGHUP)
    eventually(lambda: "reload refused" in daemon.output(), daemon)
    assert "--vgpu-split-count (from" in daemon.output()
    assert daemon.process.poll() is None
    assert state(kubelet, VGPU[0]).capacity == 10 and state(kubelet, VGPU[0]).connected
