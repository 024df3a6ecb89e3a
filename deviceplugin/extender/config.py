"""Extender configuration from flags, the environment (`KUBECONFIG` only) and a YAML file.

Precedence is flag > environment > file > default. The file is a YAML mapping whose keys are the
long flag names (`strategy: vgpu`), and it also takes Volcano's `deviceshare` scheduler arguments
under their own names, so a Volcano configuration can be carried over as is:

| Volcano key | same as |
|---|---|
| `deviceshare.GPUSharingEnable: true` | `strategy: share` |
| `deviceshare.GPUNumberEnable: true` | `strategy: number` |
| `deviceshare.VGPUEnable: true` | `strategy: vgpu` |
| `deviceshare.SchedulePolicy` | `policy` |
| `deviceshare.ScheduleWeight` | `weight` |

The three enable switches are mutually exclusive, as in Volcano. Unknown keys and bad values are
errors that name the option and where the value came from.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from deviceplugin.configfile import read_mapping
from deviceplugin.fit.errors import FitInputError
from deviceplugin.fit.keys import STRATEGIES, Strategy
from deviceplugin.fit.quantity import quantity_ceil

Policy = Literal["binpack", "spread"]
POLICIES: tuple[Policy, ...] = ("binpack", "spread")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
# Loopback unless told: in a cluster the Deployment passes the pod IP (`--address $(POD_IP):8888`),
# the address its Service sends kube-scheduler's requests to (docs/deploy.md).
DEFAULT_ADDRESS = "127.0.0.1:8888"
# The largest request kube-scheduler sends for 20,000 nodes with `nodeCacheCapable: true`, with
# margin (docs/extender.md, "Limits"): ExtenderArgs = the pod (at most etcd's 1.5 MiB object limit)
# + NodeNames (20,000 x (name + 3 bytes of JSON): 1.3 MiB for 63-character names, 4.9 MiB even at
# the 253 characters Kubernetes allows). 6.4 MiB at worst; realistic requests stay under 2 MiB.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_BODY_RANGE = (64 * 1024, 1024 * 1024 * 1024)
DEFAULT_MAX_CONNECTIONS = 512
MAX_CONNECTIONS_RANGE = (16, 65536)
DEFAULT_REQUEST_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_RANGE = (0.1, 600.0)

# Volcano's deviceshare argument names (file keys).
VOLCANO_ENABLES: dict[str, Strategy] = {
    "deviceshare.GPUSharingEnable": "share",
    "deviceshare.GPUNumberEnable": "number",
    "deviceshare.VGPUEnable": "vgpu",
}
VOLCANO_POLICY = "deviceshare.SchedulePolicy"
VOLCANO_WEIGHT = "deviceshare.ScheduleWeight"


class ExtenderConfigError(ValueError):
    """A configuration value is missing or invalid; the message names the option and its source."""


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    """What the extender runs with. `weight <= 0` turns node scoring off (every score 0)."""

    address: str = DEFAULT_ADDRESS
    strategy: Strategy = "share"
    policy: Policy = "binpack"
    weight: int = 1
    compat: Literal["volcano"] | None = None
    kubeconfig: Path | None = None
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S


# --- value parsers (raise ValueError with what is wrong; the caller adds option and source) ---


def _text(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a single value, got {type(value).__name__}")
    text = str(value).strip()
    if not text:
        raise ValueError("must not be empty")
    return text


def _choice(value: object, choices: tuple[str, ...]) -> str:
    text = _text(value)
    if text not in choices:
        raise ValueError(f"must be one of {', '.join(choices)}, not {text!r}")
    return text


def _int(value: object) -> int:
    text = _text(value)
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"must be a whole number, not {text!r}") from None


def _within(value: float, bounds: tuple[float, float], unit: str) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise ValueError(f"must be from {low:g} to {high:g} {unit}, not {value:g}")


def _body_bytes(value: object) -> int:
    text = _text(value)
    try:
        size = quantity_ceil(text)
    except FitInputError:
        raise ValueError(f"must be a number of bytes (8388608 or 8Mi), not {text!r}") from None
    _within(size, MAX_BODY_RANGE, "bytes")
    return size


def _connections(value: object) -> int:
    count = _int(value)
    _within(count, MAX_CONNECTIONS_RANGE, "connections")
    return count


def _seconds(value: object) -> float:
    text = _text(value)
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"must be a number of seconds, not {text!r}") from None
    if not math.isfinite(seconds):
        raise ValueError(f"must be a number of seconds, not {text!r}")
    _within(seconds, REQUEST_TIMEOUT_RANGE, "seconds")
    return seconds


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = _text(value).lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"must be true or false, not {value!r}")


def _compat(value: object) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    if text in ("", "none"):
        return None
    if text != "volcano":
        raise ValueError(f"must be 'volcano' or 'none', not {text!r}")
    return text


def _address(value: object) -> str:
    text = _text(value)
    split_address(text)
    return text


def split_address(address: str) -> tuple[str, int]:
    """`host:port`, `:port` (every interface) or `[v6]:port` as (host, port); port 0 picks a free one."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"must be HOST:PORT or :PORT, not {address!r}")
    host = host.strip("[]")
    return host, int(port)


_PARSERS: dict[str, Any] = {
    "address": _address,
    "strategy": lambda v: _choice(v, STRATEGIES),
    "policy": lambda v: _choice(v, POLICIES),
    "weight": _int,
    "compat": _compat,
    "kubeconfig": lambda v: Path(_text(v)),
    "log-format": lambda v: _choice(v, LOG_FORMATS),
    "log-level": lambda v: _choice(v, LOG_LEVELS),
    "max-body-bytes": _body_bytes,
    "max-connections": _connections,
    "request-timeout": _seconds,
}
OPTIONS = tuple(_PARSERS)
CONFIG_OPTION = "config"


def _parse(option: str, value: object, source: str) -> Any:
    try:
        return _PARSERS[option](value)
    except ValueError as err:
        raise ExtenderConfigError(f"option {option} ({source}): {err}") from None


def read_config_file(path: Path) -> dict[str, Any]:
    """The file's mapping; a missing, unreadable or non-mapping file is an error naming it."""
    try:
        return read_mapping(path)
    except ValueError as err:
        raise ExtenderConfigError(f"option config: {path}: {err}") from None


def _from_file(data: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """Normalise a config file's keys to option names, parsing and checking each value."""
    source = f"config file {path}"
    values: dict[str, Any] = {}
    enabled: list[tuple[str, Strategy]] = []
    for key, value in data.items():
        if key in VOLCANO_ENABLES:
            try:
                on = _bool(value)
            except ValueError as err:
                raise ExtenderConfigError(f"option {key} ({source}): {err}") from None
            if on:
                enabled.append((key, VOLCANO_ENABLES[key]))
        elif key == VOLCANO_POLICY:
            values["policy"] = (_parse("policy", value, f"{source}, key {key}"), key)
        elif key == VOLCANO_WEIGHT:
            values["weight"] = (_parse("weight", value, f"{source}, key {key}"), key)
        elif key in _PARSERS:
            if key in values:
                raise ExtenderConfigError(
                    f"option {key} ({source}): given both as {key} and as {values[key][1]}"
                )
            values[key] = (_parse(key, value, source), key)
        else:
            known = ", ".join((*OPTIONS, *VOLCANO_ENABLES, VOLCANO_POLICY, VOLCANO_WEIGHT))
            raise ExtenderConfigError(f"{source}: unknown key {key!r}; known keys: {known}")
    if len(enabled) > 1:
        names = " and ".join(key for key, _ in enabled)
        raise ExtenderConfigError(
            f"{source}: {names} are mutually exclusive (one device kind per scheduler, as in Volcano)"
        )
    if enabled:
        key, strategy = enabled[0]
        if "strategy" in values and values["strategy"][0] != strategy:
            raise ExtenderConfigError(
                f"option strategy ({source}): strategy {values['strategy'][0]!r} contradicts {key}: true"
            )
        values["strategy"] = (strategy, key)
    return {option: parsed for option, (parsed, _) in values.items()}


def load_config(flags: Mapping[str, object | None], env: Mapping[str, str] | None = None) -> ExtenderConfig:
    """Build the config from flags (option name -> value or None when not given; `config` names the
    YAML file), the environment (`KUBECONFIG`) and the file."""
    env = os.environ if env is None else env
    unknown = set(flags) - {*OPTIONS, CONFIG_OPTION}
    if unknown:
        raise ExtenderConfigError(f"unknown options: {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    config_path = flags.get(CONFIG_OPTION)
    if config_path is not None:
        path = Path(_text(config_path))
        values.update(_from_file(read_config_file(path), path))
    if env.get("KUBECONFIG"):
        values["kubeconfig"] = _parse("kubeconfig", env["KUBECONFIG"], "environment KUBECONFIG")
    for option in OPTIONS:
        value = flags.get(option)
        if value is not None:
            values[option] = _parse(option, value, f"flag --{option}")
    fields = {option.replace("-", "_"): value for option, value in values.items()}
    return replace(ExtenderConfig(), **fields)
