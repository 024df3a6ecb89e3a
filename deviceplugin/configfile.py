"""YAML configuration files: one mapping of option names to values (the daemon's and the
extender's config files share this reading; each names its own options)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_mapping(path: Path) -> dict[str, Any]:
    """The file's mapping (empty for an empty file). ValueError says what is wrong, without the
    path: the caller names the file and the option it came from."""
    # Imported when a file is read: a daemon started with flags alone registers with kubelet
    # without paying for the YAML parser (bench/startup.py).
    import yaml  # noqa: PLC0415

    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ValueError(f"cannot read it: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise ValueError(f"not valid YAML: {err}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ValueError("must be a mapping of option names to values")
    _bounded(loaded)
    return {str(key): value for key, value in loaded.items()}


MAX_VALUES = 100_000
"""Values a config file may hold once its aliases are expanded: far above any real one (a HAMi
device config with a few hundred entries), far below a 'billion laughs' (nine lists of nine
aliases: 9**9 strings from a few hundred bytes), which every later walk or message would expand."""


def _bounded(loaded: object) -> None:
    """ValueError when `loaded` holds more than MAX_VALUES values counted as a walk expands them;
    the walk stops there, so checking costs at most that many steps."""
    count = 0
    stack = [loaded]
    while stack:
        value = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ValueError(
                f"holds more than {MAX_VALUES} values once its YAML aliases are expanded (an alias bomb?)"
            )
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list | tuple | set):
            stack.extend(value)
