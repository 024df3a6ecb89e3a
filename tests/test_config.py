"""Daemon configuration: flag > environment > file > default; every bad value named (SPEC §10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin.config import OPTIONS, DaemonConfig, load_config
from deviceplugin.options import OptionError


def flags(**given: str) -> dict[str, str | None]:
    values: dict[str, str | None] = {option.name: None for option in OPTIONS}
    values["config"] = None
    values.update({name.replace("_", "-"): value for name, value in given.items()})
    return values


def test_defaults_with_only_the_node_name() -> None:
    config = load_config(flags(node_name="gpu-1"), {})
    assert config == DaemonConfig(node_name="gpu-1")
    assert config.kubelet_socket == Path("/var/lib/kubelet/device-plugins/kubelet.sock")
    assert (config.gpu_strategy, config.gpu_memory_factor, config.vgpu_split_count) == ("share", 1, 10)


def test_flag_beats_env_beats_file(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("gpu-strategy: number\nvgpu-split-count: 4\nlog-format: json\nnode-name: from-file\n")
    env = {"GPU_STRATEGY": "vgpu", "VGPU_SPLIT_COUNT": "6", "NODE_NAME": "from-env"}
    config = load_config(flags(config=str(file), gpu_strategy="share"), env)
    assert config.gpu_strategy == "share"  # flag
    assert config.vgpu_split_count == 6  # env over file
    assert config.log_format == "json"  # file over default
    assert config.node_name == "from-env"


def test_config_file_from_env_and_typed_yaml_values(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("node-name: n\ngpu-memory-factor: 16\nhealth-recovery-period: 2.5\n")
    config = load_config(flags(), {"CONFIG_FILE": str(file)})
    assert (config.gpu_memory_factor, config.health_recovery_period) == (16, 2.5)


def test_empty_env_values_count_as_unset() -> None:
    assert load_config(flags(node_name="n"), {"GPU_STRATEGY": "", "KUBECONFIG": ""}).gpu_strategy == "share"


def test_auto_factor_and_paths() -> None:
    config = load_config(
        flags(node_name="n", gpu_memory_factor="auto", device_plugin_dir="/tmp/dp", fake_gpus="2x10989"), {}
    )
    assert config.gpu_memory_factor == "auto"
    assert config.kubelet_socket == Path("/tmp/dp/kubelet.sock")


@pytest.mark.parametrize(
    ("given", "env", "message"),
    [
        (
            {"gpu_memory_factor": "0"},
            {},
            r"--gpu-memory-factor: invalid value '0': must be a positive whole number",
        ),
        ({"gpu_memory_factor": "-4"}, {}, r"--gpu-memory-factor: invalid value '-4'"),
        ({"gpu_memory_factor": "1.5"}, {}, r"--gpu-memory-factor: invalid value '1.5'.*or auto"),
        (
            {},
            {"GPU_MEMORY_FACTOR": "0"},
            r"--gpu-memory-factor \(from env GPU_MEMORY_FACTOR\): invalid value '0'",
        ),
        (
            {"gpu_strategy": "mig"},
            {},
            r"--gpu-strategy: invalid value 'mig': must be one of share, number, vgpu",
        ),
        ({"device_id_strategy": "name"}, {}, r"--device-id-strategy: invalid value 'name'"),
        ({"vgpu_split_count": "0"}, {}, r"--vgpu-split-count: invalid value '0'"),
        ({"health_recovery_period": "nan"}, {}, r"--health-recovery-period: invalid value 'nan'"),
        ({"health_recovery_period": "-1"}, {}, r"--health-recovery-period: invalid value '-1'"),
        (
            {"metrics_address": "localhost"},
            {},
            r"--metrics-address: invalid value 'localhost': must be HOST:PORT",
        ),
        ({"metrics_address": ":99999"}, {}, r"--metrics-address: invalid value ':99999'"),
        ({"log_format": "xml"}, {}, r"--log-format: invalid value 'xml'"),
        ({"node_name": "  "}, {}, r"--node-name: invalid value '  ': must not be empty"),
        ({"fake_gpu_events": "/tmp/e"}, {}, r"--fake-gpu-events needs --fake-gpus"),
        ({"vgpu_handshake": "yes"}, {}, r"--vgpu-handshake: invalid value 'yes': must be true or false"),
        ({"vgpu_handshake_interval": "0"}, {}, r"--vgpu-handshake-interval: invalid value '0'"),
        (
            {"vgpu_handshake_interval": "60"},
            {},
            r"--vgpu-handshake-interval: invalid value '60': must be below 60: Volcano drops a node",
        ),
        ({"node_resync_interval": "-1"}, {}, r"--node-resync-interval: invalid value '-1'"),
    ],
)
def test_bad_values_name_the_option_and_source(
    given: dict[str, str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        load_config(flags(**{"node_name": "n", **given}), env)


def test_node_name_is_required() -> None:
    with pytest.raises(OptionError, match=r"--node-name \(or env NODE_NAME\) is required"):
        load_config(flags(), {})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "gpu-strategy: [share]\nnode-name: n\n",
            r"--gpu-strategy \(from .*c.yaml\): invalid value \['share'\]",
        ),
        ("gpu_strategy: share\n", r"unknown option\(s\) gpu_strategy"),
        ("- a\n- b\n", r"must be a mapping of option names to values"),
        ("a: [\n", r"not valid YAML"),
        ("node-name: n\nvgpu-split-count: true\n", r"--vgpu-split-count \(from .*\): invalid value True"),
        ("node-name: n\nvgpu-handshake: 1\n", r"--vgpu-handshake \(from .*\): invalid value 1: must be true"),
    ],
)
def test_bad_config_files(tmp_path: Path, content: str, message: str) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(content)
    with pytest.raises(OptionError, match=message):
        load_config(flags(config=str(file)), {})


def test_unreadable_config_file(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"config file .*missing.yaml: cannot read it: No such file"):
        load_config(flags(node_name="n", config=str(tmp_path / "missing.yaml")), {})


def test_empty_config_file_is_fine(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("")
    assert load_config(flags(node_name="n", config=str(file)), {}).node_name == "n"


def test_vgpu_mode_from_flag_env_and_file(tmp_path: Path) -> None:
    assert load_config(flags(node_name="n", gpu_strategy="vgpu"), {}).vgpu_mode == "hami-core"
    env = {"VGPU_MODE": "mig"}
    assert load_config(flags(node_name="n", gpu_strategy="vgpu"), env).vgpu_mode == "mig"
    assert load_config(flags(node_name="n", gpu_strategy="vgpu", vgpu_mode="hami-core"), env).vgpu_mode == (
        "hami-core"
    )
    file = tmp_path / "own.yaml"
    file.write_text(
        "vgpu-mode: mig\nvgpu-mig-geometries:\n- models: [H100]\n  allowedGeometries:\n"
        "  - group: halves\n    geometries: [{name: 3g.40gb, memory: 40448, count: 2}]\n"
    )
    config = load_config(flags(node_name="n", gpu_strategy="vgpu", config=str(file)), {})
    assert config.vgpu_mode == "mig"
    assert config.vgpu_mig_geometries is not None
    (geometry,) = config.vgpu_mig_geometries
    assert (geometry.models, geometry.groups[0].name, geometry.groups[0].instances[0].count) == (
        ("H100",),
        "halves",
        2,
    )


def test_mig_geometries_from_a_file_named_by_flag(tmp_path: Path) -> None:
    file = tmp_path / "geometries.yaml"
    file.write_text("knownMigGeometries:\n- models: [A30]\n  allowedGeometries: []\n")
    given = flags(node_name="n", gpu_strategy="vgpu", vgpu_mode="mig", vgpu_mig_geometries=str(file))
    config = load_config(given, {})
    assert config.vgpu_mig_geometries is not None and config.vgpu_mig_geometries[0].models == ("A30",)
    file.write_text("knownMigGeometries:\n- models: A30\n")
    with pytest.raises(
        OptionError, match=r"--vgpu-mig-geometries: .*knownMigGeometries\[0\].models: must be a list"
    ):
        load_config(given, {})


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"vgpu_mode": "turbo"}, r"--vgpu-mode: invalid value 'turbo': must be one of hami-core, mig, mps"),
        (
            {"vgpu_mode": "mps", "vgpu_memory_scaling": "2"},
            r"--vgpu-memory-scaling: must be 1 with --vgpu-mode mps",
        ),
        (
            {"vgpu_mode": "mig", "vgpu_memory_scaling": "2"},
            r"--vgpu-memory-scaling: must be 1 with --vgpu-mode mig",
        ),
    ],
)
def test_bad_vgpu_modes_are_refused(given: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        load_config(flags(node_name="n", gpu_strategy="vgpu", **given), {})


def test_mps_mode_and_its_daemons_from_flags_and_env() -> None:
    config = load_config(flags(node_name="n", gpu_strategy="vgpu", vgpu_mode="mps"), {})
    assert (config.vgpu_mode, config.mps_root, config.mps_control, config.mps_sidecar) == (
        "mps",
        Path("/run/nvidia/mps"),
        "nvidia-cuda-mps-control",
        False,
    )
    env = {
        "VGPU_MODE": "mps",
        "MPS_ROOT": "/srv/mps",
        "MPS_CONTROL": "/opt/mps-control",
        "MPS_SIDECAR": "true",
    }
    config = load_config(flags(node_name="n", gpu_strategy="vgpu"), env)
    assert (config.vgpu_mode, config.mps_root, config.mps_control, config.mps_sidecar) == (
        "mps",
        Path("/srv/mps"),
        "/opt/mps-control",
        True,
    )
    with pytest.raises(OptionError, match=r"--mps-root: for --gpu-strategy vgpu only"):
        load_config(flags(node_name="n", gpu_strategy="share", mps_root="/srv/mps"), {})


def test_vgpu_mode_is_for_vgpu_nodes_only() -> None:
    with pytest.raises(OptionError, match=r"--vgpu-mode: for --gpu-strategy vgpu only"):
        load_config(flags(node_name="n", gpu_strategy="share", vgpu_mode="mig"), {})
