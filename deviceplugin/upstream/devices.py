"""volcano-sh/devices' config file (`--config-file` / `CONFIG_FILE` there): `version: v1beta1` and
`flags: {GPUStrategy, GPUMemoryFactor}` (its `pkg/apis`). It is told apart from this daemon's own
config file by those two top-level keys, which are no option names here.

volcano-sh/devices itself overwrites the file's flags with the command line's values, defaults
included, so there the file never takes effect; here it does, below flags and env as its doc says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceplugin.upstream.fields import Reading, UpstreamError, fields, text, whole

VERSION = "v1beta1"  # the only one volcano-sh/devices reads; empty means this one
TOP_LEVEL = ("version", "flags")
FLAGS = {"GPUStrategy": "gpu-strategy", "GPUMemoryFactor": "gpu-memory-factor"}


def is_devices_config(loaded: Mapping[str, Any]) -> bool:
    return any(str(key).lower() in TOP_LEVEL for key in loaded)


def read_devices_config(loaded: Mapping[str, Any]) -> Reading:
    """The options the file sets. Names match regardless of case (the file is read as JSON by Go)."""
    top = fields(loaded, "", TOP_LEVEL, fold_case=True)
    version = top.get("version")
    if version is not None and text(version, "version") not in ("", VERSION):
        raise UpstreamError(f"version: {version!r} is not supported: volcano-sh/devices reads {VERSION} only")
    given = fields(top.get("flags"), "flags", FLAGS, fold_case=True)
    settings: dict[str, tuple[object, str]] = {}
    for name, option in FLAGS.items():
        value = given.get(name)
        if value is None:
            continue
        where = f"flags.{name}"
        # Go types: GPUMemoryFactor a uint (never a string such as "auto"), GPUStrategy a string
        if name == "GPUMemoryFactor":
            settings[option] = (whole(value, where, minimum=1), where)
        else:
            settings[option] = (text(value, where), where)
    return Reading(settings, (f"volcano-sh/devices config file (version {VERSION})",))
