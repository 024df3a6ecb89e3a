"""Daemon configuration from flags, environment and an optional YAML file.

Precedence is flag > environment > file > default. Every option is parsed and checked at start,
and an error names the option and where its value came from. The config file is a YAML mapping
whose keys are the long flag names (`gpu-strategy: vgpu`); unknown keys are errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from deviceplugin.configfile import read_mapping
from deviceplugin.fit.keys import STRATEGIES, Strategy

DEFAULT_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_STATE_DIR = Path("/var/lib/volcano-gpu-plugin")
DEFAULT_HOOK_PATH = Path("/usr/local/vgpu")
AUTO = "auto"


class OptionError(ValueError):
    """A configuration value is missing or invalid; the message names the option and its source."""


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    node_name: str
    gpu_strategy: Strategy = "share"
    gpu_memory_factor: int | Literal["auto"] = 1
    device_id_strategy: Literal["uuid", "index"] = "uuid"
    fake_gpus: str | None = None
    fake_gpu_events: Path | None = None
    device_plugin_dir: Path = DEFAULT_DEVICE_PLUGIN_DIR
    pod_resources_socket: Path = DEFAULT_POD_RESOURCES_SOCKET
    state_dir: Path = DEFAULT_STATE_DIR
    kubeconfig: Path | None = None
    metrics_address: str = ":9460"
    hook_path: Path = DEFAULT_HOOK_PATH
    vgpu_split_count: int = 10
    vgpu_handshake: bool = False
    vgpu_handshake_interval: float = 30.0
    node_resync_interval: float = 30.0
    health_recovery_period: float = 60.0
    allocate_timeout: float = 5.0
    reconcile_interval: float = 10.0
    release_grace_period: float = 60.0
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @property
    def kubelet_socket(self) -> Path:
        return self.device_plugin_dir / "kubelet.sock"


def _text(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a single value, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise ValueError("must not be empty")
    return text


def _choice(*choices: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        text = _text(value)
        if text not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return text

    return parse


def _positive_int(value: object) -> int:
    text = _text(value)
    if not text.isascii() or not text.isdigit() or int(text) <= 0:
        raise ValueError("must be a positive whole number")
    return int(text)


def _factor(value: object) -> int | str:
    text = _text(value)
    if text == AUTO:
        return AUTO
    try:
        return _positive_int(text)
    except ValueError:
        raise ValueError("must be a positive whole number of MiB per device, or auto") from None


def _bool(value: object) -> bool:
    if isinstance(value, bool):  # YAML's true/false
        return value
    text = _text(value).lower()
    if text not in ("true", "false"):
        raise ValueError("must be true or false")
    return text == "true"


def _seconds(value: object) -> float:
    try:
        seconds = float(_text(value))
    except ValueError:
        raise ValueError("must be a number of seconds") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("must be a positive number of seconds")
    return seconds


def _handshake_seconds(value: object) -> float:
    seconds = _seconds(value)
    if seconds >= 60:
        raise ValueError("must be below 60: Volcano drops a node whose answer is 60 s late")
    return seconds


def _path(value: object) -> Path:
    return Path(_text(value))


def _address(value: object) -> str:
    text = _text(value)
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or " " in host:
        raise ValueError("must be HOST:PORT or :PORT")
    return text


@dataclass(frozen=True, slots=True)
class Option:
    name: str  # long flag name and config-file key
    env: str
    parse: Callable[[object], object]
    help: str

    @property
    def field(self) -> str:
        return self.name.replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option(
        "node-name", "NODE_NAME", _text, "this node's name (required; from the downward API in a DaemonSet)"
    ),
    Option("gpu-strategy", "GPU_STRATEGY", _choice(*STRATEGIES), "share | number | vgpu"),
    Option("gpu-memory-factor", "GPU_MEMORY_FACTOR", _factor, "MiB per advertised memory device, or auto"),
    Option(
        "device-id-strategy", "DEVICE_ID_STRATEGY", _choice("uuid", "index"), "NVIDIA_VISIBLE_DEVICES form"
    ),
    Option("fake-gpus", "FAKE_GPUS", _text, "COUNTxMIB or a JSON file: use fake GPUs instead of NVML"),
    Option(
        "fake-gpu-events", "FAKE_GPU_EVENTS", _path, "JSON-lines file of injected faults (with --fake-gpus)"
    ),
    Option("device-plugin-dir", "DEVICE_PLUGIN_DIR", _path, "kubelet's device-plugin socket directory"),
    Option("pod-resources-socket", "POD_RESOURCES_SOCKET", _path, "kubelet's pod-resources socket"),
    Option("state-dir", "STATE_DIR", _path, "directory for the allocation ledger"),
    Option("kubeconfig", "KUBECONFIG", _path, "kubeconfig file (default: in-cluster)"),
    Option("metrics-address", "METRICS_ADDRESS", _address, "HOST:PORT for /metrics, /healthz, /readyz"),
    Option("hook-path", "HOOK_PATH", _path, "host directory holding libvgpu.so and ld.so.preload"),
    Option("vgpu-split-count", "VGPU_SPLIT_COUNT", _positive_int, "pods that may share one GPU (vgpu)"),
    Option(
        "vgpu-handshake",
        "VGPU_HANDSHAKE",
        _bool,
        "true: write node-vgpu-handshake every interval, asked or not (vgpu; default: answer Volcano only)",
    ),
    Option(
        "vgpu-handshake-interval",
        "VGPU_HANDSHAKE_INTERVAL",
        _handshake_seconds,
        "seconds between handshake answers, up to 20% less (below 60)",
    ),
    Option(
        "node-resync-interval",
        "NODE_RESYNC_INTERVAL",
        _seconds,
        "seconds between reads of the node to restore what this daemon publishes there",
    ),
    Option(
        "health-recovery-period", "HEALTH_RECOVERY_PERIOD", _seconds, "quiet seconds before a GPU recovers"
    ),
    Option(
        "allocate-timeout", "ALLOCATE_TIMEOUT", _seconds, "seconds an Allocate may wait to identify its pod"
    ),
    Option(
        "reconcile-interval", "RECONCILE_INTERVAL", _seconds, "seconds between ledger checks against kubelet"
    ),
    Option("release-grace-period", "RELEASE_GRACE_PERIOD", _seconds, "seconds a container may be unlisted"),
    Option("log-format", "LOG_FORMAT", _choice("text", "json"), "text | json"),
    Option("log-level", "LOG_LEVEL", _choice("debug", "info", "warning", "error"), "log level"),
)
CONFIG_OPTION = Option("config", "CONFIG_FILE", _path, "YAML file with any of these options")


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        loaded = read_mapping(path)
    except ValueError as err:
        raise OptionError(f"config file {path}: {err}") from None
    known = {option.name for option in OPTIONS}
    unknown = sorted(str(key) for key in loaded if key not in known)
    if unknown:
        raise OptionError(f"config file {path}: unknown option(s) {', '.join(unknown)}")
    return loaded


def load_config(flags: Mapping[str, str | None], env: Mapping[str, str]) -> DaemonConfig:
    """Resolve every option; `flags` maps long option names to the given value or None."""
    config_path = flags.get(CONFIG_OPTION.name) or env.get(CONFIG_OPTION.env) or None
    file_values = read_config_file(Path(config_path)) if config_path else {}
    values: dict[str, object] = {}
    for option in OPTIONS:
        flag, from_env = flags.get(option.name), env.get(option.env, "")
        if flag is not None:
            raw, source = flag, f"--{option.name}"
        elif from_env.strip():
            raw, source = from_env, f"--{option.name} (from env {option.env})"
        elif option.name in file_values:
            raw, source = file_values[option.name], f"--{option.name} (from {config_path})"
        else:
            continue
        try:
            values[option.field] = option.parse(raw)
        except ValueError as err:
            raise OptionError(f"{source}: invalid value {raw!r}: {err}") from None
    if "node_name" not in values:
        raise OptionError("--node-name (or env NODE_NAME) is required")
    if "fake_gpu_events" in values and "fake_gpus" not in values:
        raise OptionError("--fake-gpu-events needs --fake-gpus")
    return DaemonConfig(**values)  # type: ignore[arg-type]  # each value was parsed for its field
