"""YAML configuration files: one mapping of option names to values (the daemon's and the
extender's config files share this reading; each names its own options)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_mapping(path: Path) -> dict[str, Any]:
    """The file's mapping (empty for an empty file). ValueError says what is wrong, without the
    path: the caller names the file and the option it came from."""
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
    return {str(key): value for key, value in loaded.items()}
