"""Extender configuration: flags over the environment over the file, Volcano's deviceshare keys,
and a clear error naming the option for every bad value."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from deviceplugin.extender import ExtenderConfig, ExtenderConfigError, add_parser, load_config, main


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "extender.yaml"
    path.write_text(text)
    return str(path)


def test_defaults() -> None:
    config = load_config({}, env={})
    assert config == ExtenderConfig()
    assert (config.address, config.strategy, config.policy, config.weight, config.compat) == (
        "127.0.0.1:8888",  # loopback unless told: the Deployment gives the pod IP
        "share",
        "binpack",
        1,
        None,
    )
    assert (config.max_body_bytes, config.max_connections, config.request_timeout) == (8 << 20, 512, 10.0)


def test_server_limits_from_flags_and_file(tmp_path: Path) -> None:
    config_file = _file(tmp_path, "max-body-bytes: 16Mi\nmax-connections: 64\n")
    config = load_config({"config": config_file, "request-timeout": "2.5"}, env={})
    assert (config.max_body_bytes, config.max_connections, config.request_timeout) == (16 << 20, 64, 2.5)


def test_flag_beats_environment_beats_file(tmp_path: Path) -> None:
    config_file = _file(tmp_path, "strategy: vgpu\npolicy: spread\nweight: 3\nkubeconfig: /from/file\n")
    config = load_config(
        {"config": config_file, "policy": "binpack", "address": "127.0.0.1:9000"},
        env={"KUBECONFIG": "/from/env"},
    )
    assert config.strategy == "vgpu"
    assert config.policy == "binpack"
    assert config.weight == 3
    assert config.kubeconfig == Path("/from/env")
    assert config.address == "127.0.0.1:9000"
    assert load_config(
        {"config": config_file, "kubeconfig": "/flag"}, env={"KUBECONFIG": "/env"}
    ).kubeconfig == Path("/flag")


def test_volcano_deviceshare_arguments_are_accepted(tmp_path: Path) -> None:
    config_file = _file(
        tmp_path,
        "deviceshare.VGPUEnable: true\ndeviceshare.GPUSharingEnable: false\n"
        "deviceshare.SchedulePolicy: spread\ndeviceshare.ScheduleWeight: 10\ncompat: volcano\n",
    )
    config = load_config({"config": config_file}, env={})
    assert (config.strategy, config.policy, config.weight, config.compat) == ("vgpu", "spread", 10, "volcano")
    number = load_config({"config": _file(tmp_path, "deviceshare.GPUNumberEnable: 'true'\n")}, env={})
    assert number.strategy == "number"


@pytest.mark.parametrize(
    ("text", "flags", "expected"),
    [
        ("deviceshare.GPUSharingEnable: true\ndeviceshare.VGPUEnable: true\n", {}, "mutually exclusive"),
        ("deviceshare.GPUSharingEnable: true\ndeviceshare.GPUNumberEnable: true\n", {}, "mutually exclusive"),
        ("deviceshare.VGPUEnable: maybe\n", {}, "deviceshare.VGPUEnable (from "),
        ("strategy: share\ndeviceshare.VGPUEnable: true\n", {}, "contradicts deviceshare.VGPUEnable: true"),
        (
            "deviceshare.SchedulePolicy: pack\n",
            {},
            "extender.yaml deviceshare.SchedulePolicy): invalid value",
        ),
        ("deviceshare.ScheduleWeight: heavy\n", {}, "--weight (from "),
        ("strategy: mig\n", {}, "--strategy (from "),
        ("polcy: spread\n", {}, "unknown option(s) polcy (known: address, "),
        ("- a\n- list\n", {}, "must be a mapping"),
        ("strategy: [share\n", {}, "not valid YAML"),
        ("", {"strategy": "gpu"}, "--strategy: invalid value 'gpu': must be one of share, number, vgpu"),
        ("", {"policy": "random"}, "--policy: invalid value 'random'"),
        ("", {"weight": "1.5"}, "--weight: invalid value '1.5': must be a whole number"),
        ("", {"compat": "hami"}, "--compat: invalid value 'hami'"),
        ("", {"address": "8888"}, "--address: invalid value '8888'"),
        ("", {"address": "host:99999"}, "--address: invalid value"),
        ("", {"max-body-bytes": "8 MiB"}, "--max-body-bytes: invalid value '8 MiB': must be a number"),
        (
            "",
            {"max-body-bytes": "1Ki"},
            "--max-body-bytes: invalid value '1Ki': must be at least 65536 bytes",
        ),
        ("", {"max-body-bytes": "2Gi"}, "must be at most 1073741824 bytes"),
        ("", {"max-connections": "1"}, "--max-connections: invalid value '1': must be at least 16"),
        ("", {"max-connections": "9" * 5000}, "--max-connections: invalid value '99999"),
        (
            "",
            {"request-timeout": "1e-9"},
            "--request-timeout: invalid value '1e-9': must be at least 0.1 seconds",
        ),
        (
            "",
            {"request-timeout": "nan"},
            "--request-timeout: invalid value 'nan': must be a number of seconds",
        ),
        ("max-body-bytes: [1]\n", {}, "--max-body-bytes (from "),
    ],
)
def test_bad_values_name_the_option(tmp_path: Path, text: str, flags: dict[str, str], expected: str) -> None:
    with pytest.raises(ExtenderConfigError) as caught:
        load_config({"config": _file(tmp_path, text), **flags}, env={})
    assert expected in str(caught.value)


def test_a_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ExtenderConfigError, match=r"absent\.yaml: cannot read it"):
        load_config({"config": str(tmp_path / "absent.yaml")}, env={})


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="deviceplugin")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["extender", *argv])


def test_the_sub_command_parses_every_option() -> None:
    args = _parse("--strategy", "vgpu", "--policy", "spread", "--weight", "2", "--address", ":9999")
    assert (args.strategy, args.policy, args.weight, args.address) == ("vgpu", "spread", "2", ":9999")


def test_main_rejects_a_bad_option_with_exit_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_parse("--policy", "roundrobin")) == 2
    assert "--policy: invalid value 'roundrobin'" in capsys.readouterr().err
