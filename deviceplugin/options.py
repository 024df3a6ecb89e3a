"""The one configuration layer of the daemon (`deviceplugin.config`) and the extender
(`deviceplugin.extender.config`): typed options, the value readers both use, and one resolution.

Precedence is flag > environment > file > default; a blank environment variable counts as unset.
An error names the option and where its value came from, in one form for both programs:
`--policy: invalid value 'random': ...` (a flag), `--kubeconfig (from env KUBECONFIG): ...`,
`--weight (from /etc/x.yaml deviceshare.ScheduleWeight): ...` (a file, and the key in it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from deviceplugin.configfile import read_mapping

T = TypeVar("T")
Reader = Callable[[object], T]  # raw value (flag or variable text, YAML scalar) -> typed; ValueError says why
Layer = dict[str, tuple[object, str]]  # a file's options: name -> (raw value, "from <path> [key]")

# Go's strconv.ParseBool, which reads Volcano's scheduler arguments and the upstream plugins' flags.
TRUE = ("1", "t", "T", "TRUE", "true", "True")
FALSE = ("0", "f", "F", "FALSE", "false", "False")


class OptionError(ValueError):
    """A configuration value is missing or invalid; the message names the option and its source."""


# --- value readers ------------------------------------------------------------------------------


def text(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a single value, got {type(value).__name__}")
    stripped = str(value).strip()
    if not stripped:
        raise ValueError("must not be empty")
    return stripped


def choice(*choices: str) -> Reader[str]:
    def read(value: object) -> str:
        given = text(value)
        if given not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return given

    return read


def boolean(value: object) -> bool:
    """A YAML boolean, or text as Go's strconv.ParseBool spells it (`yes` is not one)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip() in TRUE + FALSE:
        return value.strip() in TRUE
    raise ValueError(f"must be true or false ({', '.join(TRUE + FALSE)})")


def whole(value: object) -> int:
    given = text(value)
    try:
        return int(given)
    except ValueError:
        raise ValueError("must be a whole number") from None


def within(
    number: float, low: float, high: float, unit: str, *, low_why: str = "", high_why: str = ""
) -> None:
    """Refuse a number outside [low, high], saying which bound and why it is there."""
    if number < low:
        raise ValueError(f"must be at least {_shown(low)} {unit}{low_why and ': ' + low_why}")
    if number > high:
        raise ValueError(f"must be at most {_shown(high)} {unit}{high_why and ': ' + high_why}")


def _shown(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def seconds(low: float, high: float, *, low_why: str = "", high_why: str = "") -> Reader[float]:
    """A number of seconds from `low` to `high`."""

    def read(value: object) -> float:
        try:
            number = float(text(value))
        except ValueError:
            raise ValueError("must be a number of seconds") from None
        if not math.isfinite(number):
            raise ValueError("must be a number of seconds")
        within(number, low, high, "seconds", low_why=low_why, high_why=high_why)
        return number

    return read


def pathname(value: object) -> Path:
    return Path(text(value))


def split_address(address: str) -> tuple[str, int]:
    """`host:port`, `:port` (every interface) or `[v6]:port` as (host, port); port 0 picks a free one."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535 or " " in host:
        raise ValueError("must be HOST:PORT or :PORT")
    return host.strip("[]"), int(port)


def address(value: object) -> str:
    given = text(value)
    split_address(given)
    return given


# --- options and their resolution ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Option:
    name: str  # long flag name and config-file key
    env: str | None  # environment variable, if it has one
    parse: Reader[Any]
    help: str
    aliases: tuple[str, ...] = ()  # the upstream programs' flag names for it

    @property
    def field(self) -> str:
        return self.name.replace("-", "_")


def candidates(
    option: Option, flags: Mapping[str, object | None], env: Mapping[str, str], layers: tuple[Layer, ...]
) -> list[tuple[object, str]]:
    """Every value given for the option with its source, highest rank first."""
    found: list[tuple[object, str]] = []
    flag = flags.get(option.name)
    if flag is not None:
        found.append((flag, f"--{option.name}"))
    from_env = env.get(option.env, "") if option.env else ""
    if from_env.strip():
        found.append((from_env, f"--{option.name} (from env {option.env})"))
    for layer in layers:
        if option.name in layer:
            raw, origin = layer[option.name]
            found.append((raw, f"--{option.name} ({origin})"))
    return found


def read(parse: Reader[T], raw: object, source: str) -> T:
    """`raw` read by `parse`, or an OptionError naming the value's source."""
    try:
        return parse(raw)
    except ValueError as err:
        raise OptionError(f"{source}: invalid value {raw!r}: {err}") from None


def resolve(
    option: Option, flags: Mapping[str, object | None], env: Mapping[str, str], layers: tuple[Layer, ...]
) -> tuple[Any, str, list[tuple[object, str]]] | None:
    """(value, source, the values it overrides) of the highest-ranked value given; None if none is."""
    found = candidates(option, flags, env, layers)
    if not found:
        return None
    (raw, source), *overridden = found
    return read(option.parse, raw, source), source, overridden


def file_options(path: Path) -> dict[str, Any]:
    """A config file's mapping; an OptionError names the file when it cannot be read."""
    try:
        return read_mapping(path)
    except ValueError as err:
        raise OptionError(f"config file {path}: {err}") from None


def refuse_unknown(path: Path, keys: Collection[str], known: Collection[str]) -> None:
    unknown = sorted(str(key) for key in keys if key not in known)
    if unknown:
        raise OptionError(
            f"config file {path}: unknown option(s) {', '.join(unknown)} (known: {', '.join(known)})"
        )
