"""Upstream configuration read as the upstream plugins' users wrote it: volcano-sh/devices' config
file and the HAMi vGPU plugin's ConfigMaps (tests/data/upstream). Each field maps onto an option
with flag > env > node entry > device config > config file; every malformed or unsupported field
stops the daemon with a message naming it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.cli import build_parser
from deviceplugin.config import DaemonConfig, load_config
from deviceplugin.gpu.exclude import GpuExclusion, parse_exclusion
from deviceplugin.options import OptionError
from tests.daemons import GPU1
from tests.test_config import flags

DATA = Path(__file__).parent / "data" / "upstream"
CONFIG_MAPS = DATA / "volcano-vgpu-configmaps.yaml"
DEVICES_CONFIG = DATA / "volcano-device-plugin-config.yaml"
NODE = "node-1"


def config_map_data() -> dict[str, str]:
    """The ConfigMaps' data by key (`device-config.yaml`, `config.json`), as kubelet mounts them."""
    data: dict[str, str] = {}
    for doc in yaml.safe_load_all(CONFIG_MAPS.read_text()):
        data.update(doc["data"])
    return data


def mount_config_maps(directory: Path) -> tuple[Path, Path]:
    """Write both ConfigMaps' files into `directory`: (device-config.yaml, config.json)."""
    paths = []
    for key, content in config_map_data().items():
        (directory / key).write_text(content)
        paths.append(directory / key)
    device, node = paths
    return device, node


def device_config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(config_map_data()["device-config.yaml"])
    return loaded


def node_config() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(config_map_data()["config.json"])
    return loaded


def vgpu_config(
    tmp_path: Path,
    device: dict[str, Any] | None = None,
    node: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    **given: str,
) -> DaemonConfig:
    """load_config for node-1 in vGPU mode on the given upstream files (the shipped ones by
    default; None for either: that file as shipped)."""
    device_path, node_path = mount_config_maps(tmp_path)
    if device is not None:
        device_path.write_text(yaml.safe_dump(device))
    if node is not None:
        node_path.write_text(json.dumps(node))
    options = {
        "node_name": NODE,
        "gpu_strategy": "vgpu",
        "vgpu_device_config": str(device_path),
        "vgpu_node_config": str(node_path),
        **given,
    }
    return load_config(flags(**options), env or {})


# ---------------------------------------------------------------------------- HAMi ConfigMaps


def test_the_config_maps_as_shipped_upstream_set_every_option(tmp_path: Path) -> None:
    config = vgpu_config(tmp_path)
    assert config.vgpu_split_count == 6  # node-1's entry over deviceSplitCount 4
    assert config.vgpu_memory_scaling == 2.0  # node-1's devicememoryscaling over deviceMemoryScaling 1
    assert config.vgpu_core_scaling == 1.5  # deviceCoreScaling; node-1 sets none
    assert config.gpu_memory_factor == 4
    assert config.vgpu_disable_core_limit is True
    assert config.exclude_gpus == GpuExclusion(frozenset({GPU1}), frozenset({2}))
    notes = "\n".join(config.notes)
    assert "nvidia.knownMigGeometries: 2 model(s) checked" in notes
    assert "nodeconfig[0] applies to node node-1" in notes
    node_wins = r"nvidia.deviceSplitCount\): 4 is overridden by --vgpu-split-count \(from .*devicesplitcount"
    assert re.search(node_wins, notes)
    assert "resourceMemoryPercentageName: read by Volcano's scheduler" in notes
    assert "nvidia.defaultCores, defaultGPUNum, defaultMemory, overwriteEnv: at the values" in notes


def test_flag_and_env_beat_the_node_entry_which_beats_the_device_config(tmp_path: Path) -> None:
    own = tmp_path / "own.yaml"
    own.write_text("vgpu-split-count: 9\nvgpu-core-scaling: 3\n")
    config = vgpu_config(
        tmp_path,
        env={"VGPU_MEMORY_SCALING": "1.25"},
        config=str(own),
        vgpu_split_count="2",
    )
    assert (config.vgpu_split_count, config.vgpu_memory_scaling) == (2, 1.25)
    assert config.vgpu_core_scaling == 1.5  # device-config.yaml over the daemon's own config file
    notes = "\n".join(config.notes)
    assert re.search(
        r"nodeconfig\[0\].devicesplitcount\): 6 is overridden by --vgpu-split-count$", notes, re.M
    )
    assert "nodeconfig[0].devicememoryscaling): 2.0 is overridden by --vgpu-memory-scaling (from env" in notes
    assert re.search(
        r"own.yaml\): 3 is overridden by --vgpu-core-scaling \(from .*nvidia.deviceCoreScaling", notes
    )


def test_a_node_without_an_entry_gets_the_device_config(tmp_path: Path) -> None:
    config = vgpu_config(tmp_path, node_name="gpu-node-9")
    assert (config.vgpu_split_count, config.vgpu_memory_scaling, config.exclude_gpus) == (4, 1.0, None)
    assert any("no nodeconfig entry names node gpu-node-9" in note for note in config.notes)


def test_zero_and_null_in_the_node_entry_mean_unset_as_upstream(tmp_path: Path) -> None:
    node = node_config()
    node["nodeconfig"][0].update(devicememoryscaling=0, devicesplitcount=0, operatingmode=None)
    node["nodeconfig"][0]["filterdevices"] = None
    config = vgpu_config(tmp_path, node=node)
    assert (config.vgpu_split_count, config.vgpu_memory_scaling, config.exclude_gpus) == (4, 1.0, None)


def test_node_config_names_match_regardless_of_case_as_go_json_does(tmp_path: Path) -> None:
    entry = {
        "Name": NODE,
        "OperatingMode": "hami-core",
        "DeviceSplitCount": 3,
        "FilterDevices": {"Index": [1]},
    }
    config = vgpu_config(tmp_path, node={"NodeConfig": [entry]})
    assert (config.vgpu_split_count, config.exclude_gpus) == (3, GpuExclusion(indices=frozenset({1})))


def test_another_nodes_mig_entry_is_not_this_nodes_business(tmp_path: Path) -> None:
    assert node_config()["nodeconfig"][1]["operatingmode"] == "mig"  # shipped as such
    assert vgpu_config(tmp_path).vgpu_split_count == 6


def test_an_mps_entry_runs_the_node_in_mps(tmp_path: Path) -> None:
    node = node_config()
    node["nodeconfig"][0].update(operatingmode="mps", devicememoryscaling=0)
    assert vgpu_config(tmp_path, node=node).vgpu_mode == "mps"


def test_a_mig_entry_runs_the_node_in_mig_with_the_device_configs_geometries(tmp_path: Path) -> None:
    node = node_config()
    node["nodeconfig"][0].update(operatingmode="mig", devicememoryscaling=0)
    config = vgpu_config(tmp_path, node=node)
    assert config.vgpu_mode == "mig"
    geometries = config.vgpu_mig_geometries
    assert geometries is not None
    assert [g.models for g in geometries] == [("A30",), ("A100-SXM4-40GB", "A100-PCIE-40GB")]
    a100 = geometries[1]
    assert [(g.name, [(i.name, i.memory, i.count) for i in g.instances]) for g in a100.groups] == [
        ("group1", [("1g.5gb", 5120, 7)]),
        ("group2", [("2g.10gb", 10240, 3), ("1g.5gb", 5120, 1)]),
    ]
    assert vgpu_config(tmp_path).vgpu_mode == "hami-core"  # as shipped: node-1's entry says so


def test_a_mig_node_refuses_memory_scaling(tmp_path: Path) -> None:
    node = node_config()
    node["nodeconfig"][0].update(operatingmode="mig")  # devicememoryscaling 2 as shipped
    with pytest.raises(OptionError, match=r"--vgpu-memory-scaling: must be 1 with --vgpu-mode mig"):
        vgpu_config(tmp_path, node=node)


def test_a_device_config_that_also_holds_ascend_vnpus(tmp_path: Path) -> None:
    device = device_config() | {"vnpus": [{"chipName": "910B3"}]}
    config = vgpu_config(tmp_path, device=device)
    assert any("vnpus: Volcano's Ascend vNPU section" in note for note in config.notes)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("deviceSplitCount", 0, r"nvidia.deviceSplitCount: must be a whole number of at least 1, got 0"),
        ("deviceSplitCount", "10", r"nvidia.deviceSplitCount: must be a whole number .* got '10'"),
        ("deviceSplitCount", 2.5, r"nvidia.deviceSplitCount: must be a whole number"),
        ("gpuMemoryFactor", 0, r"nvidia.gpuMemoryFactor: must be a whole number of at least 1"),
        ("gpuMemoryFactor", "auto", r"nvidia.gpuMemoryFactor: must be a whole number"),
        ("deviceMemoryScaling", 0, r"nvidia.deviceMemoryScaling: must be above 0, got 0"),
        ("deviceMemoryScaling", "1.5", r"nvidia.deviceMemoryScaling: must be a number, got '1.5'"),
        ("deviceMemoryScaling", True, r"nvidia.deviceMemoryScaling: must be a number"),
        ("deviceCoreScaling", -1, r"nvidia.deviceCoreScaling: must be above 0"),
        (
            "deviceCoreScaling",
            0.001,
            r"--vgpu-core-scaling \(from .*device-config.yaml nvidia.deviceCoreScaling\): "
            r"invalid value 0.001: must be 0.01 or more",
        ),
        ("disableCoreLimit", "yes", r"nvidia.disableCoreLimit: must be true or false, got 'yes'"),
        (
            "resourceCountName",
            "nvidia.com/gpu",
            r"nvidia.resourceCountName: 'nvidia.com/gpu' is not supported",
        ),
        (
            "resourceMemoryName",
            "nvidia.com/gpumem",
            r"nvidia.resourceMemoryName: .* serves volcano.sh/vgpu-memory",
        ),
        (
            "resourceCoreName",
            "nvidia.com/gpucores",
            r"nvidia.resourceCoreName: .* serves volcano.sh/vgpu-cores",
        ),
        ("resourceCoreName", 100, r"nvidia.resourceCoreName: must be a string"),
        ("resourceMemoryPercentageName", 5, r"nvidia.resourceMemoryPercentageName: must be a string"),
        ("overwriteEnv", True, r"nvidia.overwriteEnv: True is not supported: Volcano has no admission step"),
        ("overwriteEnv", "false", r"nvidia.overwriteEnv: must be true or false"),
        (
            "defaultMemory",
            1024,
            r"nvidia.defaultMemory: 1024 is not supported: .*ask for volcano.sh/vgpu-memory",
        ),
        ("defaultCores", 50, r"nvidia.defaultCores: 50 is not supported"),
        ("defaultGPUNum", 2, r"nvidia.defaultGPUNum: 2 is not supported: .* one GPU"),
        ("defaultGPUNum", -1, r"nvidia.defaultGPUNum: must be a whole number"),
        ("passDeviceSpecs", True, r"nvidia.passDeviceSpecs: True is not supported: .*container runtime"),
        ("resourcePriorityName", "nvidia.com/priority", r"nvidia.resourcePriorityName: .* not supported"),
        ("knownMigGeometries", {"models": []}, r"nvidia.knownMigGeometries: must be a list, got dict"),
        ("knownMigGeometries", [{"model": ["A30"]}], r"nvidia.knownMigGeometries\[0\].model: unknown field"),
        (
            "knownMigGeometries",
            [{"models": "A30"}],
            r"nvidia.knownMigGeometries\[0\].models: must be a list, got str",
        ),
        (
            "knownMigGeometries",
            [
                {
                    "models": ["A30"],
                    "allowedGeometries": [
                        {"group": "g1", "geometries": [{"name": "1g.6gb", "memory": "6gb", "count": 4}]}
                    ],
                }
            ],
            r"nvidia.knownMigGeometries\[0\].allowedGeometries\[0\].geometries\[0\].memory: must be a whole",
        ),
        (
            "knownMigGeometries",
            [{"models": ["A30"], "allowedGeometries": [{"group": 1}]}],
            r"nvidia.knownMigGeometries\[0\].allowedGeometries\[0\].group: must be a string",
        ),
        ("deviceSplitcount", 10, r"nvidia.deviceSplitcount: unknown field \(known: .*deviceSplitCount"),
    ],
)
def test_every_device_config_field_that_cannot_be_honoured_is_named(
    tmp_path: Path, field: str, value: object, message: str
) -> None:
    device = device_config()
    device["nvidia"][field] = value
    with pytest.raises(OptionError, match=message):
        vgpu_config(tmp_path, device=device)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("nvidai:\n  deviceSplitCount: 4\n", r"nvidai: unknown field \(known: nvidia, vnpus\)"),
        ("nvidia: [4]\n", r"nvidia: must be a mapping, got list"),
        ("- nvidia\n", r"must be a mapping of option names to values"),
        ("nvidia: {\n", r"not valid YAML"),
    ],
)
def test_a_malformed_device_config_file_is_named(tmp_path: Path, content: str, message: str) -> None:
    device_path, _ = mount_config_maps(tmp_path)
    device_path.write_text(content)
    with pytest.raises(OptionError, match=rf"^--vgpu-device-config {re.escape(str(device_path))}: {message}"):
        load_config(flags(node_name=NODE, gpu_strategy="vgpu", vgpu_device_config=str(device_path)), {})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"operatingmode": "turbo"},
            r"nodeconfig\[0\].operatingmode: 'turbo' must be one of hami-core, mig, mps",
        ),
        ({"migstrategy": "single"}, r"nodeconfig\[0\].migstrategy: 'single' is not supported yet: .*MIG"),
        ({"migstrategy": "mixed"}, r"nodeconfig\[0\].migstrategy: 'mixed' is not supported yet"),
        ({"migstrategy": "half"}, r"nodeconfig\[0\].migstrategy: 'half' must be one of none, single, mixed"),
        (
            {"devicememoryscaling": -1},
            r"nodeconfig\[0\].devicememoryscaling: must be above 0 \(or 0 for unset\)",
        ),
        ({"devicememoryscaling": "2"}, r"nodeconfig\[0\].devicememoryscaling: must be a number, got '2'"),
        ({"devicecorescaling": -0.5}, r"nodeconfig\[0\].devicecorescaling: must be above 0"),
        ({"devicesplitcount": -1}, r"nodeconfig\[0\].devicesplitcount: must be a whole number of at least 0"),
        ({"devicesplitcount": 1.5}, r"nodeconfig\[0\].devicesplitcount: must be a whole number"),
        (
            {"filterdevices": {"uuid": "GPU-1"}},
            r"nodeconfig\[0\].filterdevices.uuid: must be a list, got str",
        ),
        (
            {"filterdevices": {"uuid": ["0"]}},
            r"nodeconfig\[0\].filterdevices.uuid\[0\]: '0' is not a GPU UUID",
        ),
        ({"filterdevices": {"uuid": [7]}}, r"nodeconfig\[0\].filterdevices.uuid\[0\]: must be a string"),
        (
            {"filterdevices": {"index": [-1]}},
            r"nodeconfig\[0\].filterdevices.index\[0\]: must be a whole number",
        ),
        ({"filterdevices": {"indexes": [1]}}, r"nodeconfig\[0\].filterdevices.indexes: unknown field"),
        ({"filterdevices": ["GPU-1"]}, r"nodeconfig\[0\].filterdevices: must be a mapping, got list"),
        ({"name": ""}, r"nodeconfig\[0\].name: must name a node"),
        ({"name": 7}, r"nodeconfig\[0\].name: must be a string, got int 7"),
        ({"name": "a100-node"}, r"nodeconfig\[1\].name: 'a100-node' is also the name of nodeconfig\[0\]"),
        (
            {"enablegetpreferredallocation": True},
            r"nodeconfig\[0\].enablegetpreferredallocation: unknown field \(known: devicecorescaling",
        ),
    ],
)
def test_every_node_config_field_that_cannot_be_honoured_is_named(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    node = node_config()
    node["nodeconfig"][0].update(change)
    with pytest.raises(OptionError, match=rf"^--vgpu-node-config .*config.json: {message}"):
        vgpu_config(tmp_path, node=node)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"nodeconfig": [', r"not valid JSON"),
        ('{"nodeconfig": ' + "[" * 100_000, r"not valid JSON: nested too deeply to read"),
        ('{"nodeconfig": {"name": "node-1"}}', r"nodeconfig: must be a list, got dict"),
        ('{"nodes": []}', r"nodes: unknown field \(known: nodeconfig\)"),
        ('["node-1"]', r"the file: must be a mapping, got list"),
        ('{"nodeconfig": ["node-1"]}', r"nodeconfig\[0\]: must be a mapping, got str"),
    ],
)
def test_a_malformed_node_config_file_is_named(tmp_path: Path, content: str, message: str) -> None:
    _, node_path = mount_config_maps(tmp_path)
    node_path.write_text(content)
    with pytest.raises(OptionError, match=rf"^--vgpu-node-config {re.escape(str(node_path))}: {message}"):
        load_config(flags(node_name=NODE, gpu_strategy="vgpu", vgpu_node_config=str(node_path)), {})


def test_a_missing_upstream_file_is_an_error_not_a_default(tmp_path: Path) -> None:
    missing = tmp_path / "config.json"
    with pytest.raises(OptionError, match=r"--vgpu-node-config .*config.json: cannot read it: No such file"):
        load_config(flags(node_name=NODE, gpu_strategy="vgpu", vgpu_node_config=str(missing)), {})


@pytest.mark.parametrize(
    ("given", "env"),
    [
        ({"vgpu_device_config": "/etc/device-config.yaml"}, {}),
        ({}, {"VGPU_NODE_CONFIG": "/config/config.json"}),
        ({"vgpu_memory_scaling": "2"}, {}),
        ({"vgpu_disable_core_limit": "true"}, {}),
        ({}, {"VGPU_CORE_SCALING": "2"}),
    ],
)
def test_vgpu_only_options_are_refused_in_another_mode(given: dict[str, str], env: dict[str, str]) -> None:
    with pytest.raises(
        OptionError, match=r"^--vgpu-[a-z-]+: for --gpu-strategy vgpu only \(this node runs share\)"
    ):
        load_config(flags(node_name=NODE, **given), env)


# ---------------------------------------------------------------------------- volcano-sh/devices


def devices_config(
    tmp_path: Path, content: str, env: dict[str, str] | None = None, **given: str
) -> DaemonConfig:
    file = tmp_path / "config.yaml"
    file.write_text(content)
    return load_config(flags(node_name=NODE, config=str(file), **given), env or {})


def test_the_devices_config_file_selects_strategy_and_factor(tmp_path: Path) -> None:
    config = devices_config(tmp_path, DEVICES_CONFIG.read_text())
    assert (config.gpu_strategy, config.gpu_memory_factor) == ("share", 64)
    assert any("volcano-sh/devices config file (version v1beta1)" in note for note in config.notes)


def test_devices_config_ranks_below_flags_and_env(tmp_path: Path) -> None:
    content = "version: v1beta1\nflags:\n  GPUStrategy: number\n  GPUMemoryFactor: 10\n"
    assert devices_config(tmp_path, content).gpu_strategy == "number"
    config = devices_config(tmp_path, content, env={"GPU_MEMORY_FACTOR": "32"}, gpu_strategy="share")
    assert (config.gpu_strategy, config.gpu_memory_factor) == ("share", 32)


@pytest.mark.parametrize(
    "content",
    [
        "flags:\n  GPUStrategy: number\n",  # no version: v1beta1, as upstream
        "version: ''\nflags:\n  GPUStrategy: number\n",
        "Version: v1beta1\nFLAGS:\n  gpustrategy: number\n",  # sigs.k8s.io/yaml matches any case
    ],
)
def test_devices_config_read_as_volcano_sh_devices_reads_it(tmp_path: Path, content: str) -> None:
    assert devices_config(tmp_path, content).gpu_strategy == "number"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "version: v1\nflags: {}\n",
            r"version: 'v1' is not supported: volcano-sh/devices reads v1beta1 only",
        ),
        ("version: 1\n", r"version: must be a string, got int"),
        ("version: v1beta1\nflags: [share]\n", r"flags: must be a mapping, got list"),
        ("version: v1beta1\nflags:\n  MigStrategy: none\n", r"flags.MigStrategy: unknown field \(known: GPU"),
        (
            "version: v1beta1\nflags:\n  GPUMemoryFactor: '10'\n",
            r"flags.GPUMemoryFactor: must be a whole number",
        ),
        ("version: v1beta1\nflags:\n  GPUMemoryFactor: 0\n", r"flags.GPUMemoryFactor: .*at least 1, got 0"),
        ("version: v1beta1\nflags:\n  GPUMemoryFactor: auto\n", r"flags.GPUMemoryFactor: must be a whole"),
        ("version: v1beta1\nflags:\n  GPUStrategy: 1\n", r"flags.GPUStrategy: must be a string, got int"),
        ("version: v1beta1\ngpu-strategy: vgpu\n", r"gpu-strategy: unknown field \(known: flags, version\)"),
    ],
)
def test_a_malformed_devices_config_is_named(tmp_path: Path, content: str, message: str) -> None:
    with pytest.raises(OptionError, match=rf"^config file .*config.yaml: {message}"):
        devices_config(tmp_path, content)


def test_a_bad_strategy_in_the_devices_config_names_its_field(tmp_path: Path) -> None:
    content = "version: v1beta1\nflags:\n  GPUStrategy: mig\n"
    with pytest.raises(
        OptionError, match=r"--gpu-strategy \(from .*config.yaml flags.GPUStrategy\): invalid value 'mig'"
    ):
        devices_config(tmp_path, content)


# ---------------------------------------------------------------------------- flags


def test_the_upstream_flag_names_are_accepted() -> None:
    args = build_parser().parse_args(["run", "--config-file", "/etc/c.yaml", "--device-cores-scaling", "2"])
    assert (args.config, args.vgpu_core_scaling) == ("/etc/c.yaml", "2")
    # the HAMi vGPU plugin's --device-split-count (cmd/vgpu/main.go)
    args = build_parser().parse_args(["run", "--device-split-count", "4"])
    assert args.vgpu_split_count == "4"


def test_run_help_shows_the_upstream_flag_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    shown = capsys.readouterr().out
    assert "--config VALUE, --config-file VALUE" in shown
    assert "--vgpu-core-scaling VALUE, --device-cores-scaling VALUE" in shown


def test_exclude_gpus_takes_uuids_and_indices() -> None:
    assert parse_exclusion(f"{GPU1}, 2") == GpuExclusion(frozenset({GPU1}), frozenset({2}))
    assert parse_exclusion([GPU1, 3]) == GpuExclusion(frozenset({GPU1}), frozenset({3}))


@pytest.mark.parametrize("value", ["-1", "gpu1", "", "GPU-a,,1", "GPU-a b"])
def test_exclude_gpus_refuses_what_names_no_gpu(value: str) -> None:
    with pytest.raises(
        OptionError, match=rf"--exclude-gpus: invalid value {re.escape(repr(value))}: .*GPU UUID"
    ):
        load_config(flags(node_name=NODE, exclude_gpus=value), {})
