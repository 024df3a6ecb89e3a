"""Daemon configuration from flags, environment and an optional YAML file.

Precedence is flag > environment > file > default. Every option is parsed and checked at start,
and an error names the option and where its value came from (`deviceplugin.options`: the layer and
value readers the extender's configuration shares). The config file is a YAML mapping
whose keys are the long flag names (`gpu-strategy: vgpu`); unknown keys are errors. It may be
volcano-sh/devices' config file instead (`version`, `flags`). The HAMi vGPU plugin's ConfigMaps
(`--vgpu-device-config`, `--vgpu-node-config`) are files too, ranked above the config file: its
node entry, then its device config (`deviceplugin.upstream` reads both formats).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from deviceplugin.configfile import read_mapping
from deviceplugin.fit import keys
from deviceplugin.fit.keys import STRATEGIES, Strategy
from deviceplugin.fit.model import MigGeometry
from deviceplugin.gpu.exclude import GpuExclusion, parse_exclusion
from deviceplugin.gpu.topology import NamedTopology, read_topology
from deviceplugin.options import (
    Layer,
    Option,
    OptionError,
    address,
    boolean,
    candidates,
    choice,
    file_options,
    pathname,
    refuse_unknown,
    resolve,
    seconds,
    text,
)
from deviceplugin.upstream.devices import is_devices_config, read_devices_config
from deviceplugin.upstream.fields import Reading, UpstreamError
from deviceplugin.upstream.hami import mig_geometries, read_device_config, read_node_config

DEFAULT_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_STATE_DIR = Path("/var/lib/volcano-gpu-plugin")
DEFAULT_HOOK_PATH = Path("/usr/local/vgpu")
DEFAULT_MPS_ROOT = Path("/run/nvidia/mps")  # NVIDIA's device plugin's default host root
DEFAULT_MPS_CONTROL = "nvidia-cuda-mps-control"
AUTO = "auto"
# Every interval, period and timeout: a tenth of a second at least (1e-9 s made a loop take 84 % of a
# CPU), a day at most (far longer ones overflow the platform's timed waits in the worker threads).
MIN_SECONDS = 0.1
MAX_SECONDS = 86400.0
MAX_ALLOCATE_WAIT_S = 60.0
# Volcano drops a node whose handshake answer is 60 s late.
HANDSHAKE_LIMIT_S = 60.0


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    node_name: str
    gpu_strategy: Strategy = "share"
    gpu_memory_factor: int | Literal["auto"] = 1
    device_id_strategy: Literal["uuid", "index"] = "uuid"
    fake_gpus: str | None = None
    fake_gpu_events: Path | None = None
    fake_gpu_topology: NamedTopology | None = None  # a preset or a topology file, read with the options
    device_plugin_dir: Path = DEFAULT_DEVICE_PLUGIN_DIR
    pod_resources_socket: Path = DEFAULT_POD_RESOURCES_SOCKET
    state_dir: Path = DEFAULT_STATE_DIR
    kubeconfig: Path | None = None
    # Loopback unless told: the DaemonSet passes the pod IP (METRICS_ADDRESS=$(POD_IP):9460), where
    # kubelet's probes and Prometheus reach it (docs/deploy.md).
    metrics_address: str = "127.0.0.1:9460"
    metrics_request_timeout: float = 10.0
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
    vgpu_memory_scaling: float = 1.0
    vgpu_core_scaling: float = 1.0
    vgpu_disable_core_limit: bool = False
    vgpu_mode: Literal["hami-core", "mig", "mps"] = "hami-core"
    vgpu_mig_geometries: tuple[MigGeometry, ...] | None = None  # None: the built-in default
    mps_root: Path = DEFAULT_MPS_ROOT
    mps_control: str = DEFAULT_MPS_CONTROL
    mps_sidecar: bool = False  # the control daemons are started by a sidecar: only checked here
    exclude_gpus: GpuExclusion | None = None
    vgpu_device_config: Path | None = None
    vgpu_node_config: Path | None = None
    notes: tuple[str, ...] = ()  # what the upstream files hold that needs nothing here, and why; logged

    @property
    def kubelet_socket(self) -> Path:
        return self.device_plugin_dir / "kubelet.sock"


def _positive_int(value: object) -> int:
    given_text = text(value)
    if not given_text.isascii() or not given_text.isdigit() or int(given_text) <= 0:
        raise ValueError("must be a positive whole number")
    return int(given_text)


def _factor(value: object) -> int | str:
    given_text = text(value)
    if given_text == AUTO:
        return AUTO
    try:
        return _positive_int(given_text)
    except ValueError:
        raise ValueError("must be a positive whole number of MiB per device, or auto") from None


BUSY_POLL = "shorter only busy-polls a CPU"
# An interval, period or timeout: MIN_SECONDS to MAX_SECONDS.
_seconds = seconds(MIN_SECONDS, MAX_SECONDS, low_why=BUSY_POLL, high_why="a day")
_allocate_seconds = seconds(
    MIN_SECONDS,
    MAX_ALLOCATE_WAIT_S,
    low_why=BUSY_POLL,
    high_why="kubelet admits one pod at a time and waits for Allocate without a deadline, so every "
    "pod on the node waits as long",
)


def _handshake_seconds(value: object) -> float:
    interval = seconds(MIN_SECONDS, math.inf, low_why=BUSY_POLL)(value)
    if interval >= HANDSHAKE_LIMIT_S:
        raise ValueError(
            f"must be below {HANDSHAKE_LIMIT_S:g}: Volcano drops a node whose answer is 60 s late"
        )
    return interval


def _scaling(value: object) -> float:
    try:
        scaling = float(text(value))
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(scaling) or scaling <= 0:
        raise ValueError("must be a number above 0")
    return scaling


def _core_scaling(value: object) -> float:
    scaling = _scaling(value)
    if scaling * 100 < 1:
        raise ValueError("must be 0.01 or more: each GPU offers 100 x it vgpu-cores")
    return scaling


def _vgpu_mode(value: object) -> str:
    mode = text(value)
    if mode not in keys.SHARING_MODES:
        raise ValueError(f"must be one of {', '.join(keys.SHARING_MODES)}")
    return mode


def _mig_geometries(value: object) -> tuple[MigGeometry, ...]:
    """A `knownMigGeometries` list (from a config file), or the path of a YAML file holding one
    under that key (from a flag or the environment)."""
    if not isinstance(value, str):
        return mig_geometries(value)
    path = pathname(value)
    try:
        loaded = read_mapping(path)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    if set(loaded) != {"knownMigGeometries"}:
        held = ", ".join(sorted(loaded)) or "nothing"
        raise ValueError(f"{path}: must hold knownMigGeometries only, not {held}")
    return mig_geometries(loaded["knownMigGeometries"], f"{path} knownMigGeometries")


def _fake_topology(value: object) -> NamedTopology:
    """A preset's name or a topology file (docs/topology.md), read now so a fault names the option."""
    return read_topology(text(value))


def _socket_path(value: object) -> Path:
    """Made absolute from the working directory: gRPC reads `unix://plugins/x.sock` as host `plugins`."""
    return pathname(value).absolute()


OPTIONS: tuple[Option, ...] = (
    Option(
        "node-name", "NODE_NAME", text, "this node's name (required; from the downward API in a DaemonSet)"
    ),
    Option(
        "gpu-strategy",
        "GPU_STRATEGY",
        choice(*STRATEGIES),
        "share | number | vgpu | whole (nvidia.com/gpu, whole GPUs: docs/whole.md)",
    ),
    Option("gpu-memory-factor", "GPU_MEMORY_FACTOR", _factor, "MiB per advertised memory device, or auto"),
    Option(
        "device-id-strategy", "DEVICE_ID_STRATEGY", choice("uuid", "index"), "NVIDIA_VISIBLE_DEVICES form"
    ),
    Option("fake-gpus", "FAKE_GPUS", text, "COUNTxMIB or a JSON file: use fake GPUs instead of NVML"),
    Option(
        "fake-gpu-events",
        "FAKE_GPU_EVENTS",
        pathname,
        "JSON-lines file of injected faults (with --fake-gpus)",
    ),
    Option(
        "fake-gpu-topology",
        "FAKE_GPU_TOPOLOGY",
        _fake_topology,
        "the fake GPUs' interconnect: dgx-a100, pcie-2socket, nvlink-pairs or a JSON file (with --fake-gpus)",
    ),
    Option(
        "device-plugin-dir", "DEVICE_PLUGIN_DIR", _socket_path, "kubelet's device-plugin socket directory"
    ),
    Option("pod-resources-socket", "POD_RESOURCES_SOCKET", _socket_path, "kubelet's pod-resources socket"),
    Option("state-dir", "STATE_DIR", pathname, "directory for the allocation ledger"),
    Option("kubeconfig", "KUBECONFIG", pathname, "kubeconfig file (default: in-cluster)"),
    Option(
        "metrics-address",
        "METRICS_ADDRESS",
        address,
        "HOST:PORT for /metrics, /healthz, /readyz (default loopback; the DaemonSet gives the pod IP)",
    ),
    Option(
        "metrics-request-timeout",
        "METRICS_REQUEST_TIMEOUT",
        _seconds,
        "seconds a request to the metrics listener may take to arrive whole; slower gets 408",
    ),
    Option("hook-path", "HOOK_PATH", pathname, "host directory holding libvgpu.so and ld.so.preload"),
    Option(
        "vgpu-split-count",
        "VGPU_SPLIT_COUNT",
        _positive_int,
        "pods that may share one GPU (vgpu)",
        aliases=("device-split-count",),
    ),
    Option(
        "vgpu-handshake",
        "VGPU_HANDSHAKE",
        boolean,
        "true: write node-vgpu-handshake every interval, asked or not (vgpu; default: answer Volcano only)",
    ),
    Option(
        "vgpu-handshake-interval",
        "VGPU_HANDSHAKE_INTERVAL",
        _handshake_seconds,
        "seconds between handshake answers, up to 20% less (0.1 to below 60)",
    ),
    Option(
        "node-resync-interval",
        "NODE_RESYNC_INTERVAL",
        _seconds,
        "seconds between reads of the node to restore what this daemon publishes there (0.1 to 86400)",
    ),
    Option(
        "health-recovery-period",
        "HEALTH_RECOVERY_PERIOD",
        _seconds,
        "quiet seconds before a GPU recovers (0.1 to 86400)",
    ),
    Option(
        "allocate-timeout",
        "ALLOCATE_TIMEOUT",
        _allocate_seconds,
        "seconds an Allocate may wait to identify its pod (0.1 to 60)",
    ),
    Option(
        "reconcile-interval",
        "RECONCILE_INTERVAL",
        _seconds,
        "seconds between ledger checks against kubelet (0.1 to 86400)",
    ),
    Option(
        "release-grace-period",
        "RELEASE_GRACE_PERIOD",
        _seconds,
        "seconds a container may be unlisted (0.1 to 86400)",
    ),
    Option(
        "vgpu-memory-scaling",
        "VGPU_MEMORY_SCALING",
        _scaling,
        "each GPU offers its MiB x this; above 1 oversubscribes with HAMi-core (vgpu)",
    ),
    Option(
        "vgpu-core-scaling",
        "VGPU_CORE_SCALING",
        _core_scaling,
        "each GPU offers 100 x this vgpu-cores (vgpu)",
        aliases=("device-cores-scaling",),
    ),
    Option(
        "vgpu-disable-core-limit",
        "VGPU_DISABLE_CORE_LIMIT",
        boolean,
        "true: HAMi-core does not hold containers to their vgpu-cores (vgpu)",
    ),
    Option(
        "vgpu-mode",
        "VGPU_MODE",
        _vgpu_mode,
        "hami-core | mig | mps: share each GPU with HAMi-core, give each container a MIG device, or "
        "share each GPU through MPS (vgpu)",
    ),
    Option(
        "vgpu-mig-geometries",
        "VGPU_MIG_GEOMETRIES",
        _mig_geometries,
        "YAML file with knownMigGeometries: the MIG groups of each model (vgpu mig; default built in)",
    ),
    Option(
        "mps-root",
        "MPS_ROOT",
        pathname,
        "host directory of the MPS control daemons' pipe, log and shm directories (vgpu mps)",
    ),
    Option(
        "mps-control",
        "MPS_CONTROL",
        text,
        "the MPS control binary, run to start and ask each GPU's daemon (vgpu mps)",
    ),
    Option(
        "mps-sidecar",
        "MPS_SIDECAR",
        boolean,
        "true: a sidecar starts the MPS control daemons; they are only checked here (vgpu mps)",
    ),
    Option("exclude-gpus", "EXCLUDE_GPUS", parse_exclusion, "GPU UUIDs or indices this node does not offer"),
    Option("vgpu-device-config", "VGPU_DEVICE_CONFIG", pathname, "the HAMi vGPU plugin's device-config.yaml"),
    Option("vgpu-node-config", "VGPU_NODE_CONFIG", pathname, "the HAMi vGPU plugin's per-node config.json"),
    Option("log-format", "LOG_FORMAT", choice("text", "json"), "text | json"),
    Option("log-level", "LOG_LEVEL", choice("debug", "info", "warning", "error"), "log level"),
)
CONFIG_OPTION = Option(
    "config",
    "CONFIG_FILE",
    pathname,
    "YAML file with any of these options, or volcano-sh/devices' config file",
    aliases=("config-file",),
)
# What decides which upstream files are read, and for which node: resolved before the others.
FIRST = ("node-name", "gpu-strategy", "vgpu-device-config", "vgpu-node-config")
# Options only one strategy reads: given to a node running another, they are a mistake.
STRATEGY_ONLY: Mapping[str, Strategy] = dict.fromkeys(
    (
        "vgpu-memory-scaling",
        "vgpu-core-scaling",
        "vgpu-disable-core-limit",
        "vgpu-mode",
        "vgpu-mig-geometries",
        "mps-root",
        "mps-control",
        "mps-sidecar",
        *FIRST[2:],
    ),
    "vgpu",
)


def _reading(path: Path, name: str, reading: Reading) -> tuple[Layer, list[str]]:
    layer = {option: (value, f"from {path} {field}") for option, (value, field) in reading.settings.items()}
    return layer, [f"{name} {path}: {note}" for note in reading.notes]


def read_config_file(path: Path) -> tuple[Layer, list[str]]:
    """The config file's options (own keys, or volcano-sh/devices' format) and notes to log."""
    loaded = file_options(path)
    try:
        if is_devices_config(loaded):
            return _reading(path, "config file", read_devices_config(loaded))
    except UpstreamError as err:
        raise OptionError(f"config file {path}: {err}") from None
    refuse_unknown(path, loaded, [option.name for option in OPTIONS])
    return {key: (value, f"from {path}") for key, value in loaded.items()}, []


def read_hami_files(values: Mapping[str, object]) -> tuple[Layer, list[str]]:
    """The HAMi vGPU plugin's files given so far: the node's entry in config.json over
    device-config.yaml."""
    layer: Layer = {}
    notes: list[str] = []
    node = str(values["node_name"])
    for name, read in (
        ("vgpu-device-config", read_device_config),
        ("vgpu-node-config", lambda path: read_node_config(path, node)),
    ):
        path = values.get(name.replace("-", "_"))
        if not isinstance(path, Path):
            continue
        try:
            more, said = _reading(path, f"--{name}", read(path))
        except UpstreamError as err:
            raise OptionError(f"--{name} {path}: {err}") from None
        notes.extend(said)
        for option, (value, origin) in more.items():
            if option in layer and layer[option][0] != value:
                lower, lower_origin = layer[option]
                notes.append(f"--{option} ({lower_origin}): {lower!r} is overridden by --{option} ({origin})")
            layer[option] = (value, origin)
    return layer, notes


def _same(option: Option, raw: object, parsed: object) -> bool:
    try:
        return bool(option.parse(raw) == parsed)
    except ValueError:
        return False


def load_config(flags: Mapping[str, str | None], env: Mapping[str, str]) -> DaemonConfig:
    """Resolve every option; `flags` maps long option names to the given value or None."""
    config_path = flags.get(CONFIG_OPTION.name) or env.get(CONFIG_OPTION.env or "") or None
    own, notes = read_config_file(Path(config_path)) if config_path else ({}, [])
    values: dict[str, object] = {}
    hami: Layer = {}  # the HAMi vGPU plugin's files, once the options that name them are known

    def settle(option: Option, layers: tuple[Layer, ...]) -> None:
        resolved = resolve(option, flags, env, layers)
        if resolved is None:
            return
        values[option.field], source, overridden = resolved
        if option.name in hami:  # say where an upstream file's value loses, or wins over the config file
            notes.extend(
                f"{lower}: {value!r} is overridden by {source}"
                for value, lower in overridden
                if not _same(option, value, values[option.field])
            )

    for option in OPTIONS:
        if option.name in FIRST:
            settle(option, (own,))
    if "node_name" not in values:
        raise OptionError("--node-name (or env NODE_NAME) is required")
    strategy = values.get("gpu_strategy", "share")
    foreign = [
        o.name
        for o in OPTIONS
        if STRATEGY_ONLY.get(o.name, strategy) != strategy and candidates(o, flags, env, (own,))
    ]
    if foreign:
        names = ", ".join(f"--{name}" for name in foreign)
        owner = STRATEGY_ONLY[foreign[0]]
        raise OptionError(f"{names}: for --gpu-strategy {owner} only (this node runs {strategy})")
    hami, more = read_hami_files(values)
    notes.extend(more)
    for option in OPTIONS:
        if option.name not in FIRST:
            settle(option, (hami, own))
    if "fake_gpu_events" in values and "fake_gpus" not in values:
        raise OptionError("--fake-gpu-events needs --fake-gpus")
    if "fake_gpu_topology" in values and "fake_gpus" not in values:
        raise OptionError("--fake-gpu-topology needs --fake-gpus (real GPUs publish what NVML reports)")
    if values.get("vgpu_mode") == keys.MODE_MIG and values.get("vgpu_memory_scaling", 1.0) != 1.0:
        raise OptionError(
            "--vgpu-memory-scaling: must be 1 with --vgpu-mode mig: a MIG device's memory is the "
            "hardware's, with nothing to oversubscribe it"
        )
    if values.get("vgpu_mode") == keys.MODE_MPS and values.get("vgpu_memory_scaling", 1.0) != 1.0:
        raise OptionError(
            "--vgpu-memory-scaling: must be 1 with --vgpu-mode mps: MPS cannot back device memory "
            "with host memory (HAMi-core's oversubscription)"
        )
    values["notes"] = tuple(notes)
    return DaemonConfig(**values)  # type: ignore[arg-type]  # each value was parsed for its field
