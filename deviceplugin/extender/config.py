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
| `deviceshare.AscendHAMiVNPUEnable` | `ascend-hami-vnpu` |

`device-config` names Volcano's `device-config.yaml` (the device ConfigMap's key, mounted as a
file): its `vnpus` section lists the Ascend chips served beside the strategy (a document without
`vnpus`: none). Without it the built-in Ascend310P chip is served, as Volcano's default config has it.
Its `nvidia.knownMigGeometries` are the MIG geometry groups a `mig` node's cards are sliced into
(checked by the reader the node daemon uses, `deviceplugin.upstream.hami.mig_geometries`); without
the file or the key the built-in ones apply, the daemon's own default (`fit.mig_tables`), so the
scheduler numbers the slots as the node resolves them (docs/mig.md).
`ascend-hami-vnpu` (Volcano's `deviceshare.AscendHAMiVNPUEnable`) turns those chips on or off:
compat="volcano" defaults it off as Volcano does; the default mode defaults it on, so a cluster whose
kube-scheduler configuration names the Ascend resources (the documented one does) is served
without a second switch. Off, the filter refuses every node for a pod asking a chip's resource and
says which switch is off.

`gpu-aware` (a section of the file: `weight`, `loss.weight`, the seed's `gpu-aware` plugin
arguments; flags `--gpu-aware-weight`, `--gpu-aware-loss-weight`) blends the fragmentation-aware
node score into the binpack/spread score (docs/gpu-aware.md); both 0, the default, leave it off.
`compat: volcano` keeps Volcano's scores and refuses them above 0.

The three enable switches are mutually exclusive, as in Volcano, and read as Volcano reads them
(Go's strconv.ParseBool). Unknown keys and bad values are errors that name the option and where the
value came from. `deviceplugin.options` is the layer the daemon's configuration shares: the same
value readers, precedence and errors.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from deviceplugin.configfile import read_mapping
from deviceplugin.fit.ascend_config import DEFAULT_VNPUS, VnpusConfig, vnpus_config
from deviceplugin.fit.errors import FitInputError
from deviceplugin.fit.fragment import Weights
from deviceplugin.fit.keys import STRATEGIES, Strategy
from deviceplugin.fit.mig_tables import builtin_geometries
from deviceplugin.fit.model import MigGeometry
from deviceplugin.fit.quantity import quantity_ceil
from deviceplugin.options import (
    Layer,
    Option,
    OptionError,
    address,
    boolean,
    choice,
    file_options,
    pathname,
    read,
    refuse_unknown,
    resolve,
    seconds,
    text,
    whole,
    within,
)
from deviceplugin.upstream.hami import mig_geometries

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
VOLCANO_ASCEND = "deviceshare.AscendHAMiVNPUEnable"
_VOLCANO_OPTIONS = {VOLCANO_POLICY: "policy", VOLCANO_WEIGHT: "weight", VOLCANO_ASCEND: "ascend-hami-vnpu"}
# The seed's gpu-aware plugin arguments, under a `gpu-aware` section of the file: the option each sets.
GPU_AWARE = "gpu-aware"
GPU_AWARE_KEYS = {"weight": "gpu-aware-weight", "loss.weight": "gpu-aware-loss-weight"}
MAX_BLEND_WEIGHT = 1000.0

# The shared layer's error, by the name the extender's callers know it.
ExtenderConfigError = OptionError
BUILTIN_MIG_GEOMETRIES = builtin_geometries()


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
    device_config: Path | None = None
    vnpus: VnpusConfig = DEFAULT_VNPUS  # the Ascend chips served (read from `device_config`)
    ascend_hami_vnpu: bool | None = None  # serve `vnpus`; None: the mode's default
    mig_geometries: tuple[MigGeometry, ...] = BUILTIN_MIG_GEOMETRIES  # `nvidia.knownMigGeometries`
    gpu_aware_weight: float = 0.0  # the gpu-aware score's `weight` (docs/gpu-aware.md)
    gpu_aware_loss_weight: float = 0.0  # its `loss.weight`

    @property
    def gpu_aware(self) -> Weights:
        """The gpu-aware blend's weights (off when both are 0)."""
        return Weights(self.gpu_aware_weight, self.gpu_aware_loss_weight)

    @property
    def serves_ascend(self) -> bool:
        """Whether the `vnpus` chips are served: as told, else on by default and off under
        compat="volcano" (Volcano's `AscendHAMiVNPUEnable` defaults to false)."""
        if self.ascend_hami_vnpu is not None:
            return self.ascend_hami_vnpu
        return self.compat != "volcano"


# --- the extender's own value readers (the shared ones are in deviceplugin.options) ---


def _body_bytes(value: object) -> int:
    try:
        size = quantity_ceil(text(value))
    except FitInputError:
        raise ValueError("must be a number of bytes (8388608 or 8Mi)") from None
    within(size, *MAX_BODY_RANGE, "bytes")
    return size


def _connections(value: object) -> int:
    count = whole(value)
    within(count, *MAX_CONNECTIONS_RANGE, "connections")
    return count


def _compat(value: object) -> str | None:
    given = value.strip() if isinstance(value, str) else text(value)
    if given in ("", "none"):
        return None
    if given != "volcano":
        raise ValueError("must be 'volcano' or 'none'")
    return given


def _blend_weight(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("must be a number")
    try:
        number = float(text(value))
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(number):
        raise ValueError("must be a finite number")
    if number < 0:
        raise ValueError("must be 0 or more (0 leaves its term out of the score)")
    if number > MAX_BLEND_WEIGHT:
        raise ValueError(f"must be at most {MAX_BLEND_WEIGHT:g}")
    return number


_strategy = choice(*STRATEGIES)

OPTIONS: tuple[Option, ...] = (
    Option("address", None, address, f"listen address HOST:PORT or :PORT [default {DEFAULT_ADDRESS}]"),
    Option(
        "strategy",
        None,
        _strategy,
        "GPU family to schedule: share (volcano.sh/gpu-memory), number (volcano.sh/gpu-number), "
        "vgpu (volcano.sh/vgpu-*), whole (nvidia.com/gpu) [default share]",
    ),
    Option("policy", None, choice(*POLICIES), "node and card order: binpack or spread [default binpack]"),
    Option(
        "weight",
        None,
        whole,
        "multiplier of the node score (capped at 10); <= 0 turns scoring off [default 1]",
    ),
    Option(
        "compat",
        None,
        _compat,
        "'volcano' reproduces Volcano's decisions exactly, bugs included [default none]",
    ),
    Option(
        "kubeconfig",
        "KUBECONFIG",
        pathname,
        "kubeconfig file [env KUBECONFIG; default: in-cluster service account]",
    ),
    Option("log-format", None, choice(*LOG_FORMATS), "text or json [default text]"),
    Option("log-level", None, choice(*LOG_LEVELS), "debug, info, warning or error [default info]"),
    Option(
        "max-body-bytes",
        None,
        _body_bytes,
        "largest request body, bytes or a quantity (8Mi); larger gets 413 unread "
        f"[default {DEFAULT_MAX_BODY_BYTES}: NodeNames of 20,000 nodes and a large pod, with margin]",
    ),
    Option(
        "max-connections",
        None,
        _connections,
        "open connections; at the cap a new one closes the one idle longest "
        f"[default {DEFAULT_MAX_CONNECTIONS}]",
    ),
    Option(
        "request-timeout",
        None,
        seconds(*REQUEST_TIMEOUT_RANGE),
        "seconds a request may take to arrive whole; slower gets 408 "
        f"[default {DEFAULT_REQUEST_TIMEOUT_S:g}]",
    ),
    Option(
        "device-config",
        None,
        pathname,
        "Volcano's device-config.yaml: its vnpus section lists the Ascend chips to serve, its "
        "nvidia.knownMigGeometries the MIG groups of mig nodes "
        "[default: the built-in Ascend310P and MIG geometries]",
    ),
    Option(
        "ascend-hami-vnpu",
        None,
        boolean,
        "serve the Ascend vNPU chips of --device-config (Volcano's deviceshare.AscendHAMiVNPUEnable) "
        "[default true; false with --compat volcano, as in Volcano]",
    ),
    Option(
        "gpu-aware-weight",
        None,
        _blend_weight,
        "weight of the gpu-aware score's capacity left on the node in the node score "
        "(file: gpu-aware.weight; docs/gpu-aware.md) [default 0: off]",
    ),
    Option(
        "gpu-aware-loss-weight",
        None,
        _blend_weight,
        "weight of the gpu-aware score's fragmentation loss in the node score "
        "(file: gpu-aware.loss.weight) [default 0: off]",
    ),
)
CONFIG_OPTION = Option("config", None, pathname, "YAML config file")
_NAMES = tuple(option.name for option in OPTIONS)


def read_config_file(path: Path) -> Layer:
    """The file's options, Volcano's deviceshare keys translated to the options they set."""
    loaded = file_options(path)
    refuse_unknown(path, loaded, (*_NAMES, *VOLCANO_ENABLES, *_VOLCANO_OPTIONS, GPU_AWARE))
    layer: Layer = _gpu_aware_section(path, loaded)
    for key, value in loaded.items():
        if key in VOLCANO_ENABLES or key == GPU_AWARE:
            continue
        if key in layer:
            raise OptionError(
                f"config file {path}: {key} is given both as {key} and in the {GPU_AWARE} section"
            )
        name = _VOLCANO_OPTIONS.get(key, key)
        if name in layer:
            volcano_key = next(k for k, n in _VOLCANO_OPTIONS.items() if n == name)
            raise OptionError(f"config file {path}: {name} is given both as {name} and as {volcano_key}")
        layer[name] = (value, f"from {path}" if name == key else f"from {path} {key}")
    enabled = [
        key for key in VOLCANO_ENABLES if key in loaded and read(boolean, loaded[key], f"{key} (from {path})")
    ]
    if len(enabled) > 1:
        raise OptionError(
            f"config file {path}: {' and '.join(enabled)} are mutually exclusive (one device kind per "
            "scheduler, as in Volcano)"
        )
    if enabled:
        key, strategy = enabled[0], VOLCANO_ENABLES[enabled[0]]
        if "strategy" in layer:
            raw, origin = layer["strategy"]
            if read(_strategy, raw, f"--strategy ({origin})") != strategy:
                raise OptionError(f"--strategy ({origin}): {raw!r} contradicts {key}: true")
        layer["strategy"] = (strategy, f"from {path} {key}")
    return layer


def _gpu_aware_section(path: Path, loaded: Mapping[str, Any]) -> Layer:
    """The `gpu-aware` section's arguments as the options they set."""
    section = loaded.get(GPU_AWARE)
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise OptionError(
            f"config file {path}: {GPU_AWARE} must be a mapping of {', '.join(GPU_AWARE_KEYS)}, "
            f"not {type(section).__name__}"
        )
    unknown = sorted(f"{GPU_AWARE}.{key}" for key in section if key not in GPU_AWARE_KEYS)
    if unknown:
        raise OptionError(
            f"config file {path}: unknown option(s) {', '.join(unknown)} "
            f"(known: {', '.join(f'{GPU_AWARE}.{key}' for key in GPU_AWARE_KEYS)})"
        )
    return {GPU_AWARE_KEYS[key]: (value, f"from {path} {GPU_AWARE}.{key}") for key, value in section.items()}


def load_config(flags: Mapping[str, object | None], env: Mapping[str, str] | None = None) -> ExtenderConfig:
    """Build the config from flags (option name -> value or None when not given; `config` names the
    YAML file), the environment (`KUBECONFIG`) and the file."""
    env = os.environ if env is None else env
    unknown = set(flags) - {*_NAMES, CONFIG_OPTION.name}
    if unknown:
        raise OptionError(f"unknown options: {', '.join(sorted(unknown))}")
    config_path = flags.get(CONFIG_OPTION.name)
    file = read_config_file(read(pathname, config_path, "--config")) if config_path is not None else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for option in OPTIONS:
        resolved = resolve(option, flags, env, (file,))
        if resolved is not None:
            values[option.field], sources[option.name] = resolved[0], resolved[1]
    config = replace(ExtenderConfig(), **values)
    if config.compat == "volcano":
        for name in GPU_AWARE_KEYS.values():
            if values.get(name.replace("-", "_"), 0) > 0:
                raise OptionError(
                    f"{sources[name]}: the gpu-aware score is this project's, not Volcano's "
                    "deviceshare score; compat volcano keeps Volcano's scores, so it must be 0"
                )
    if config.device_config is None:
        return config
    vnpus, geometries = read_device_config(config.device_config, config.compat)
    return replace(config, vnpus=vnpus, mig_geometries=geometries)


def read_device_config(
    path: Path, compat: Literal["volcano"] | None
) -> tuple[VnpusConfig, tuple[MigGeometry, ...]]:
    """The Ascend chips and the MIG geometries of a `device-config.yaml`. compat="volcano": a file
    that does not load is Volcano's ConfigMap that fails to load, so the built-in defaults apply;
    otherwise an OptionError names the file and what is wrong."""
    try:
        document = read_mapping(path)
        return vnpus_config(document, compat), _mig_geometries(document)
    except (ValueError, FitInputError) as err:  # UpstreamError is a ValueError
        if compat == "volcano":
            return DEFAULT_VNPUS, BUILTIN_MIG_GEOMETRIES
        raise OptionError(f"--device-config {path}: {err}") from None


def _mig_geometries(document: Mapping[str, Any]) -> tuple[MigGeometry, ...]:
    """`nvidia.knownMigGeometries`, or the built-in ones where the document has none."""
    nvidia = document.get("nvidia")
    if nvidia is None:
        return BUILTIN_MIG_GEOMETRIES
    if not isinstance(nvidia, Mapping):
        raise ValueError(f"nvidia: must be a mapping, not {type(nvidia).__name__}")
    known = nvidia.get("knownMigGeometries")
    return BUILTIN_MIG_GEOMETRIES if known is None else mig_geometries(known, "nvidia.knownMigGeometries")
