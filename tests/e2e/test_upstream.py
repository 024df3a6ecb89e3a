"""Upstream configuration, end to end: the real daemon started on the HAMi vGPU plugin's
ConfigMaps (mounted as files) or on volcano-sh/devices' config file, with fake GPUs, the kubelet
emulator over real sockets and pods in the API-server emulator, does what the files ask."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from deviceplugin.fit.codec import decode_node_register
from kubesim.apiserver import ApiServerEmulator
from kubesim.kubelet import KubeletEmulator
from tests.daemons import GPU0, NODE, TIMEOUT_S, VGPU, Daemon, eventually, state, streaming, wait
from tests.e2e.test_vgpu import REGISTER, launch, notes, worker
from tests.test_upstream_config import DEVICES_CONFIG, mount_config_maps

NUMBER, MEMORY, CORES = VGPU


def test_the_hami_config_maps_drop_in(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    # node-1's entry: split 6, memory x2, GPU 1 (by UUID) and GPU 2 (by index) filtered out;
    # device-config.yaml: cores x1.5, 4 MiB per memory unit, core limit disabled.
    device_config, node_config_file = mount_config_maps(workdir)
    daemon = launch(
        start,
        apiserver,
        kubelet,
        workdir,
        "--fake-gpus",
        "3x4096",
        "--vgpu-device-config",
        str(device_config),
        "--vgpu-node-config",
        str(node_config_file),
    )
    number, memory, cores = (state(kubelet, resource) for resource in VGPU)
    assert set(number.devices) == {f"{GPU0}-{slot}" for slot in range(6)}
    assert set(memory.devices) == {f"{GPU0}-memory-{unit}" for unit in range(4096 * 2 // 4)}
    assert set(cores.devices) == {f"{GPU0}-core-{core}" for core in range(150)}

    eventually(lambda: REGISTER in notes(apiserver, "nodes", NODE), daemon)
    registered = decode_node_register(notes(apiserver, "nodes", NODE)[REGISTER])
    assert [(g.uuid, g.split_count, g.memory, g.mode) for g in registered] == [(GPU0, 6, 2048, "hami-core")]

    # 1500 units of 4 MiB: more than the card's 4096 MiB, within the 8192 it offers
    admission = kubelet.admit(worker(apiserver, "oversubscribed", 1500, 30, 1000))
    assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
    envs = admission.allocation("worker", NUMBER).envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == GPU0
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "6000m"
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert envs["CUDA_OVERSUBSCRIBE"] == "true"
    assert envs["GPU_CORE_UTILIZATION_POLICY"] == "disable"
    output = daemon.output()
    assert "nvidia.knownMigGeometries: 2 model(s) checked" in output  # said, not silently dropped
    assert output.count("gpu excluded") == 2


def test_without_scaling_or_core_switch_the_envs_stay_off(
    apiserver: ApiServerEmulator, kubelet: KubeletEmulator, start: Callable[..., Daemon], workdir: Path
) -> None:
    device_config, node_config_file = mount_config_maps(workdir)
    device_config.write_text(
        device_config.read_text().replace("disableCoreLimit: true", "disableCoreLimit: false")
    )
    node_config_file.write_text(
        node_config_file.read_text().replace('"devicememoryscaling": 2', '"devicememoryscaling": 1')
    )
    daemon = launch(
        start,
        apiserver,
        kubelet,
        workdir,
        "--fake-gpus",
        "1x4096",
        "--vgpu-device-config",
        str(device_config),
        "--vgpu-node-config",
        str(node_config_file),
    )
    assert state(kubelet, MEMORY).capacity == 4096 // 4
    admission = kubelet.admit(worker(apiserver, "plain", 512, 30, 1000))
    assert admission.admitted, f"{admission}\n{daemon.output()[-3000:]}"
    envs = admission.allocation("worker", NUMBER).envs
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"
    assert "CUDA_OVERSUBSCRIBE" not in envs and "GPU_CORE_UTILIZATION_POLICY" not in envs


def test_an_unsupported_operating_mode_stops_the_daemon_naming_the_field(
    start: Callable[..., Daemon], workdir: Path
) -> None:
    device_config, node_config_file = mount_config_maps(workdir)
    node_config_file.write_text(node_config_file.read_text().replace('"hami-core"', '"time-slicing"'))
    daemon = start(
        "--fake-gpus",
        "1x4096",
        "--gpu-strategy",
        "vgpu",
        "--vgpu-device-config",
        str(device_config),
        "--vgpu-node-config",
        str(node_config_file),
    )
    assert daemon.process.wait(TIMEOUT_S) == 2
    assert "nodeconfig[0].operatingmode: 'time-slicing' must be one of hami-core, mig, mps" in daemon.output()


def test_the_volcano_devices_config_file_sets_strategy_and_factor(
    kubelet: KubeletEmulator, start: Callable[..., Daemon]
) -> None:
    daemon = start("--fake-gpus", "2x4096", "--config-file", str(DEVICES_CONFIG))  # share, 64 MiB units
    wait(kubelet, streaming("volcano.sh/gpu-memory"), daemon)
    memory = state(kubelet, "volcano.sh/gpu-memory")
    assert set(memory.devices) == {f"{gpu}-{unit}" for gpu in (0, 1) for unit in range(4096 // 64)}
