"""The daemon's and the extender's configurations are one layer (issue 14 item 3): the same value
table through both loaders is accepted or refused alike, with the same precedence and the same
error naming the option and where its value came from. Before, `yes` switched an extender setting
on and was refused by the daemon."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from deviceplugin import config as daemon_config
from deviceplugin.extender import config as extender_config
from deviceplugin.options import OptionError

Load = Callable[[Mapping[str, object | None], Mapping[str, str]], Any]


def load_daemon(flags: Mapping[str, object | None], env: Mapping[str, str]) -> Any:
    given = {"node-name": "n", "gpu-strategy": "vgpu", **{k: str(v) for k, v in flags.items()}}
    return daemon_config.load_config(given, env)


def load_extender(flags: Mapping[str, object | None], env: Mapping[str, str]) -> Any:
    return extender_config.load_config(flags, env)


def outcome(load: Callable[[], Any], read: Callable[[Any], object]) -> object:
    """What the loader made of a value: the value read back, or the error's explanation (the part
    after the option and its source, which differ between the two programs' option names)."""
    try:
        return read(load())
    except OptionError as err:
        return "refused: " + str(err).split(": ", 2)[-1]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


# Every spelling someone might write for a switch: Go's strconv.ParseBool's, and others it refuses.
SPELLINGS = ["true", "false", "True", "FALSE", "1", "0", "t", "F", "yes", "no", "on", "tRuE", "maybe", "2"]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_switch_reads_the_same_in_both(tmp_path: Path, spelling: str) -> None:
    """The daemon's `vgpu-handshake` (a flag, or quoted text in its file) and the extender's
    `deviceshare.VGPUEnable` (quoted text in its file, as a Volcano ConfigMap may hold it)."""
    daemon_flag = outcome(lambda: load_daemon({"vgpu-handshake": spelling}, {}), lambda c: c.vgpu_handshake)
    daemon_file = outcome(
        lambda: load_daemon({"config": write(tmp_path, f"vgpu-handshake: '{spelling}'\n")}, {}),
        lambda c: c.vgpu_handshake,
    )
    extender_file = outcome(
        lambda: load_extender({"config": write(tmp_path, f"deviceshare.VGPUEnable: '{spelling}'\n")}, {}),
        lambda c: c.strategy == "vgpu",
    )
    assert daemon_flag == daemon_file == extender_file
    accepted = spelling in ("true", "false", "True", "FALSE", "1", "0", "t", "F")
    assert isinstance(daemon_flag, bool) == accepted, daemon_flag


@pytest.mark.parametrize("value", ["true", "false", "1", "yes"])
def test_a_yaml_value_reads_the_same_in_both(tmp_path: Path, value: str) -> None:
    """Unquoted: YAML's own booleans (PyYAML reads `yes` as true), and a number, which is no switch."""
    daemon = outcome(
        lambda: load_daemon({"config": write(tmp_path, f"vgpu-handshake: {value}\n")}, {}),
        lambda c: c.vgpu_handshake,
    )
    extender = outcome(
        lambda: load_extender({"config": write(tmp_path, f"deviceshare.VGPUEnable: {value}\n")}, {}),
        lambda c: c.strategy == "vgpu",
    )
    assert daemon == extender
    assert daemon == {"true": True, "false": False, "yes": True}.get(value, daemon)
    assert value != "1" or str(daemon).startswith("refused: must be true or false")


@pytest.mark.parametrize(
    "given", ["127.0.0.1:80", ":0", "[::1]:9000", "localhost", ":99999", "a b:80", "host:", "host:8x", "  "]
)
def test_an_address_reads_the_same_in_both(given: str) -> None:
    daemon = outcome(lambda: load_daemon({"metrics-address": given}, {}), lambda c: c.metrics_address)
    extender = outcome(lambda: load_extender({"address": given}, {}), lambda c: c.address)
    assert daemon == extender


@pytest.mark.parametrize("given", ["10", "0.1", "600", "0.05", "nan", "inf", "-1", "ten", ""])
def test_a_duration_reads_the_same_in_both(given: str) -> None:
    """Both request timeouts: a number of seconds, 0.1 at least (their ceilings differ)."""
    daemon = outcome(
        lambda: load_daemon({"metrics-request-timeout": given}, {}),
        lambda c: c.metrics_request_timeout,
    )
    extender = outcome(
        lambda: load_extender({"request-timeout": given}, {}),
        lambda c: c.request_timeout,
    )
    # the same refusal; the daemon also says why its floor is there (a loop would busy-poll a CPU)
    assert str(daemon).split(": ")[:2] == str(extender).split(": ")[:2]


@pytest.mark.parametrize("load", [load_daemon, load_extender], ids=["daemon", "extender"])
def test_flag_over_environment_over_file(tmp_path: Path, load: Load) -> None:
    config_file = write(tmp_path, "kubeconfig: /from/file\nlog-level: debug\n")

    def kubeconfig(config: Any) -> tuple[Path, str]:
        return config.kubeconfig, config.log_level

    assert kubeconfig(load({"config": config_file}, {})) == (Path("/from/file"), "debug")
    assert kubeconfig(load({"config": config_file}, {"KUBECONFIG": " "})) == (Path("/from/file"), "debug")
    assert kubeconfig(load({"config": config_file}, {"KUBECONFIG": "/from/env"})) == (
        Path("/from/env"),
        "debug",
    )
    assert kubeconfig(
        load(
            {"config": config_file, "kubeconfig": "/flag", "log-level": "error"}, {"KUBECONFIG": "/from/env"}
        )
    ) == (Path("/flag"), "error")


@pytest.mark.parametrize("load", [load_daemon, load_extender], ids=["daemon", "extender"])
def test_an_error_names_the_option_and_its_source_alike(tmp_path: Path, load: Load) -> None:
    config_file = write(tmp_path, "log-format: xml\n")
    with pytest.raises(OptionError) as from_flag:
        load({"log-format": "yaml"}, {})
    assert str(from_flag.value) == "--log-format: invalid value 'yaml': must be one of text, json"
    with pytest.raises(OptionError) as from_file:
        load({"config": config_file}, {})
    assert (
        str(from_file.value)
        == f"--log-format (from {config_file}): invalid value 'xml': must be one of text, json"
    )
    with pytest.raises(OptionError) as empty:
        load({"kubeconfig": " "}, {})
    assert str(empty.value) == "--kubeconfig: invalid value ' ': must not be empty"
    with pytest.raises(OptionError) as unknown:
        load({"config": write(tmp_path, "polcy: spread\n")}, {})  # the same file, rewritten
    assert str(unknown.value).startswith(f"config file {config_file}: unknown option(s) polcy (known: ")
