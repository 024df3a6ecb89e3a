"""Plain data the fit rules work on: GPU state, container requests, decisions, configuration."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from deviceplugin.fit import keys
from deviceplugin.fit.errors import ConfigError

Compat = Literal["volcano"] | None
"""`None`: this project's rules (Volcano's known bugs fixed); `"volcano"`: Volcano's exact behaviour."""

BINPACK = "binpack"
SPREAD = "spread"
POLICIES = (BINPACK, SPREAD)


def is_volcano_compat(compat: object) -> bool:
    """True for `compat="volcano"`, False for `None`; anything else is a configuration error."""
    if compat is None:
        return False
    if compat == "volcano":
        return True
    raise ConfigError(f"compat must be None or 'volcano', not {compat!r}")


def check_policy(policy: object, volcano: bool) -> str:
    """Normalise a schedule policy: `binpack`, `spread`, or `""` (unset).

    Volcano treats any other string as unset; this project rejects it, since it is a config typo.
    """
    if policy is None or policy == "":
        return ""
    if policy in POLICIES:
        return str(policy)
    if volcano and isinstance(policy, str):
        return ""
    raise ConfigError(f"schedule policy must be 'binpack', 'spread' or unset, not {policy!r}")


@dataclass(slots=True)
class PodUsage:
    """What one pod holds on one GPU."""

    uid: str
    name: str  # namespace/name, for people and metrics
    memory: int = 0
    cores: int = 0
    slots: int = 1  # share slots taken (one per device entry of the pod on this GPU)
    group: str = ""  # pod-group key `namespace/group`, "" when the pod has none
    labels: Mapping[str, str] = field(default_factory=dict)
    terminal: bool = False  # Succeeded/Failed; only recorded under compat="volcano"
    mig_slots: tuple[tuple[str, int], ...] = ()  # (geometry group, position) per MIG entry


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG instance type inside a geometry group, e.g. `2g.20gb`, 20480 MiB, 3 slots."""

    name: str
    memory: int
    count: int


@dataclass(frozen=True, slots=True)
class MigGroup:
    """A MIG layout a card can be partitioned into; slots are numbered across its instances."""

    name: str
    instances: tuple[MigInstance, ...]

    def offset(self, instance: int) -> int:
        """Position of the first slot of `instances[instance]`."""
        return sum(inst.count for inst in self.instances[:instance])

    def locate(self, position: int) -> tuple[int, int] | None:
        """(instance index, slot within it) of a position, or None when out of range."""
        start = 0
        for number, inst in enumerate(self.instances):
            if position < start + inst.count:
                return number, position - start
            start += inst.count
        return None


@dataclass(frozen=True, slots=True)
class MigGeometry:
    """The MIG groups allowed for cards whose type contains one of `models`."""

    models: tuple[str, ...]
    groups: tuple[MigGroup, ...]


@dataclass(slots=True)
class MigState:
    """A MIG card: its allowed groups, the group in use (-1: none) and the slots taken per instance."""

    groups: tuple[MigGroup, ...]
    active: int = -1
    used: dict[str, list[int]] = field(default_factory=dict)


class _NoPods(Mapping[str, PodUsage]):
    """The pods of a card that holds none: empty and read-only, so one object serves every such
    card (a scheduler holds every card of the cluster, most of them idle; an empty dict of its
    own is 64 bytes each). `fit.usage` gives a card a dict on its first pod and `NO_PODS` back
    when its last one leaves."""

    __slots__ = ()

    def __getitem__(self, key: str) -> PodUsage:
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return False

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "{}"


NO_PODS: Mapping[str, PodUsage] = _NoPods()


def _no_pods() -> Mapping[str, PodUsage]:
    return NO_PODS


@dataclass(slots=True)
class GpuState:
    """One physical GPU as a scheduler sees it: capacity, health, mode, and what pods use of it."""

    index: int
    uuid: str
    type: str = "NVIDIA"
    memory: int = 0  # in memory units (MiB x gpu-memory-factor)
    split_count: int = 10  # how many pods may share it (vGPU)
    cores: int = 100  # compute capacity in percent
    health: bool = True
    numa: int | None = None
    mode: str = keys.MODE_HAMI_CORE
    used_num: int = 0
    used_memory: int = 0
    used_cores: int = 0
    pods: Mapping[str, PodUsage] = field(default_factory=_no_pods)  # by UID; written by fit.usage only
    mig: MigState | None = None

    @property
    def free_memory(self) -> int:
        return max(0, self.memory - self.used_memory)


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """The vGPU request of one container. `memory_percentage=None` means "not given"."""

    name: str
    nums: int
    type: str = keys.REQUEST_TYPE_NVIDIA
    memory: int = 0
    memory_percentage: int | None = None
    cores: int = 0


@dataclass(frozen=True, slots=True)
class Assigned:
    """One device handed to a container. `index` is None when decoded from an annotation."""

    uuid: str
    index: int | None
    type: str
    memory: int
    cores: int


@dataclass(frozen=True, slots=True)
class FitResult:
    """A fit decision: per-container device lists (request order), node score, and why not."""

    ok: bool
    devices: tuple[tuple[Assigned, ...], ...] = ()
    score: float = 0.0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class VgpuConfig:
    """Resource names and vGPU settings (Volcano's `device-config.yaml` `nvidia:` section).

    `percentage_resource=None` picks the mode's default: `volcano.sh/vgpu-memory-percentage`
    normally, unset under compat="volcano" (Volcano's default config leaves it empty).
    """

    count_resource: str = keys.VGPU_NUMBER
    memory_resource: str = keys.VGPU_MEMORY
    percentage_resource: str | None = None
    cores_resource: str = keys.VGPU_CORES
    memory_factor: int = 1
    mig_geometries: tuple[MigGeometry, ...] = ()

    def percentage_name(self, volcano: bool) -> str:
        if self.percentage_resource is not None:
            return self.percentage_resource
        return "" if volcano else keys.VGPU_MEMORY_PERCENTAGE


DEFAULT_VGPU_CONFIG = VgpuConfig()
