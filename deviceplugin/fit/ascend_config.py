"""The `vnpus` section of Volcano's `device-config.yaml`: Ascend chips and their vNPU templates.

Volcano (`pkg/scheduler/api/devices/config/vnpu.go`, gopkg.in/yaml.v2) accepts a wrapper
`{hamiVnpuCore: bool, configs: [chip...]}` or a legacy bare list of chips (hamiVnpuCore false),
and falls back to a built-in Ascend310P chip when the ConfigMap does not load at all. Field names
match exactly, as yaml.v2 matches them. The section arrives here already loaded from YAML (the
fit library reads no files): lists, mappings and scalars.

By default every malformed field is a `VnpuConfigError` naming it (and, unlike yaml.v2, an
unknown field is one: it is a typo). compat="volcano" does what Volcano does with a section it
cannot decode: the whole ConfigMap fails, so the built-in default applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from deviceplugin.fit.errors import ConfigError
from deviceplugin.fit.model import Compat, is_volcano_compat

HAMI_PREFIX = "hami.io"
HUAWEI_PREFIX = "huawei.com"
_SEPARATORS = (",", ":", ";")
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


class VnpuConfigError(ConfigError):
    """The `vnpus` section cannot be read as written (names the field)."""


@dataclass(frozen=True, slots=True)
class VnpuTemplate:
    """A vNPU split of a chip, e.g. `vir02`: 6144 MiB, 2 AI cores, 2 AI CPUs."""

    name: str
    memory: int
    ai_core: int = 0
    ai_cpu: int = 0


@dataclass(frozen=True, slots=True)
class VnpuChip:
    """One configured chip (`VNPUConfig`): its resource names, memory and templates (ascending
    memory, as Volcano sorts them at load)."""

    common_word: str
    chip_name: str
    resource_name: str
    resource_memory_name: str
    memory_allocatable: int
    memory_capacity: int
    ai_core: int
    ai_cpu: int
    templates: tuple[VnpuTemplate, ...]

    @property
    def resource_core_name(self) -> str:
        """Derived, not configured (`<resourceName>-core`), as Volcano derives it."""
        return f"{self.resource_name}-core"

    @property
    def register_key(self) -> str:
        """Node annotation the HAMi Ascend device plugin registers the chips under."""
        return f"{HAMI_PREFIX}/node-register-{self.common_word}"

    @property
    def to_allocate_key(self) -> str:
        return f"{HAMI_PREFIX}/{self.common_word}-devices-to-allocate"

    @property
    def allocated_key(self) -> str:
        """Pod annotation the scheduler's ledger is rebuilt from."""
        return f"{HAMI_PREFIX}/{self.common_word}-devices-allocated"

    @property
    def runtime_key(self) -> str:
        """Pod annotation with the per-card template or hami-core limits (JSON)."""
        return f"{HUAWEI_PREFIX}/{self.common_word}"


@dataclass(frozen=True, slots=True)
class VnpusConfig:
    """The whole section: whether nodes without a `hami-vnpu-core` annotation run hami-core, and
    the chips in configured order (Volcano registers one device type per chip, in this order)."""

    hami_vnpu_core: bool
    chips: tuple[VnpuChip, ...]


ASCEND310P = VnpuChip(
    common_word="Ascend310P",
    chip_name="310P3",
    resource_name="huawei.com/Ascend310P",
    resource_memory_name="huawei.com/Ascend310P-memory",
    memory_allocatable=21527,
    memory_capacity=24576,
    ai_core=8,
    ai_cpu=7,
    templates=(
        VnpuTemplate("vir01", 3072, 1, 1),
        VnpuTemplate("vir02", 6144, 2, 2),
        VnpuTemplate("vir04", 12288, 4, 4),
    ),
)
DEFAULT_VNPUS = VnpusConfig(hami_vnpu_core=False, chips=(ASCEND310P,))
"""Volcano's `GetDefaultDevicesConfig`: what applies when the device ConfigMap does not load."""

_CHIP_FIELDS = (
    "commonWord",
    "chipName",
    "resourceName",
    "resourceMemoryName",
    "memoryAllocatable",
    "memoryCapacity",
    "aiCore",
    "aiCPU",
    "templates",
)
_TEMPLATE_FIELDS = ("name", "memory", "aiCore", "aiCPU")
_WRAPPER_FIELDS = ("hamiVnpuCore", "configs")


def _fields(value: object, where: str, known: tuple[str, ...], strict: bool) -> Mapping[str, object]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise VnpuConfigError(f"{where}: must be a mapping, not {type(value).__name__}")
    unknown = sorted(str(key) for key in value if key not in known)
    if unknown and strict:
        raise VnpuConfigError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(known)})")
    return {key: item for key, item in value.items() if item is not None}  # null: Go's zero value


def _items(value: object, where: str) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise VnpuConfigError(f"{where}: must be a list, not {type(value).__name__}")
    return value


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise VnpuConfigError(f"{where}: must be a string, not {value!r}")
    return value


def _name(value: object, where: str, strict: bool) -> str:
    """A name that stands in annotation keys and device lists: by default non-empty, unpadded and
    free of the separators those use."""
    text = _text(value, where)
    if strict and (not text or any(sep in text for sep in _SEPARATORS) or text != text.strip()):
        raise VnpuConfigError(f"{where}: {text!r} must be non-empty, unpadded and free of ',', ':' and ';'")
    return text


def _whole(value: object, where: str, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise VnpuConfigError(f"{where}: must be a whole number from {minimum} to {maximum}, not {value!r}")
    return value


class _Reader:
    """Reads the section strictly (default) or as yaml.v2 decodes it into Volcano's structs: any
    string, any integer its Go field holds, unknown fields ignored (compat)."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict

    def number(self, value: object, where: str, minimum: int, maximum: int) -> int:
        go_minimum = -maximum - 1  # Go's int32 / int64 range
        return _whole(value, where, minimum if self.strict else go_minimum, maximum)

    def template(self, value: object, where: str, allocatable: int) -> VnpuTemplate:
        known = _fields(value, where, _TEMPLATE_FIELDS, self.strict)
        memory_max = allocatable if self.strict else _INT64_MAX
        return VnpuTemplate(
            name=_name(known.get("name", ""), f"{where}.name", self.strict),
            memory=self.number(known.get("memory", 0), f"{where}.memory", 1, memory_max),
            ai_core=self.number(known.get("aiCore", 0), f"{where}.aiCore", 0, _INT32_MAX),
            ai_cpu=self.number(known.get("aiCPU", 0), f"{where}.aiCPU", 0, _INT32_MAX),
        )

    def chip(self, value: object, where: str) -> VnpuChip:
        known = _fields(value, where, _CHIP_FIELDS, self.strict)
        strict = self.strict
        allocatable = self.number(
            known.get("memoryAllocatable", 0), f"{where}.memoryAllocatable", 1, _INT64_MAX
        )
        capacity = self.number(
            known.get("memoryCapacity", 0), f"{where}.memoryCapacity", allocatable, _INT64_MAX
        )
        templates = [
            self.template(item, f"{where}.templates[{i}]", allocatable)
            for i, item in enumerate(_items(known.get("templates"), f"{where}.templates"))
        ]
        resource = _name(known.get("resourceName", ""), f"{where}.resourceName", strict)
        memory_resource = _name(known.get("resourceMemoryName", ""), f"{where}.resourceMemoryName", strict)
        common_word = _name(known.get("commonWord", ""), f"{where}.commonWord", strict)
        if strict and "/" in common_word:
            raise VnpuConfigError(
                f"{where}.commonWord: {common_word!r} must not contain '/' (it ends annotation keys)"
            )
        if strict:
            names = [template.name for template in templates]
            if len(set(names)) != len(names):
                raise VnpuConfigError(
                    f"{where}.templates: a template name is given twice ({', '.join(names)})"
                )
            if memory_resource in (resource, f"{resource}-core"):
                raise VnpuConfigError(
                    f"{where}.resourceMemoryName: {memory_resource!r} must name its own resource"
                )
        return VnpuChip(
            common_word=common_word,
            chip_name=_text(known.get("chipName", ""), f"{where}.chipName"),
            resource_name=resource,
            resource_memory_name=memory_resource,
            memory_allocatable=allocatable,
            memory_capacity=capacity,
            ai_core=self.number(known.get("aiCore", 0), f"{where}.aiCore", 0, _INT32_MAX),
            ai_cpu=self.number(known.get("aiCPU", 0), f"{where}.aiCPU", 0, _INT32_MAX),
            templates=tuple(
                sorted(templates, key=lambda template: template.memory)
            ),  # stable, as Go's sort here
        )

    def section(self, section: object) -> VnpusConfig:
        if isinstance(section, list):  # the legacy form: a bare list of chips
            hami_core = False
            chips = section
        else:
            wrapper = _fields(section, "vnpus", _WRAPPER_FIELDS, self.strict)
            flag = wrapper.get("hamiVnpuCore", False)
            if not isinstance(flag, bool):
                raise VnpuConfigError(f"vnpus.hamiVnpuCore: must be true or false, not {flag!r}")
            hami_core = flag
            chips = _items(wrapper.get("configs"), "vnpus.configs")
        parsed = tuple(self.chip(chip, f"vnpus.configs[{i}]") for i, chip in enumerate(chips))
        if self.strict:
            for what in ("common_word", "resource_name"):
                names = [getattr(chip, what) for chip in parsed]
                twice = sorted({name for name in names if names.count(name) > 1})
                if twice:
                    raise VnpuConfigError(f"vnpus.configs: {twice[0]!r} names two chips")
        return VnpusConfig(hami_vnpu_core=hami_core, chips=parsed)


def vnpus_config(document: object, compat: Compat = None) -> VnpusConfig:
    """The Ascend chips of a loaded `device-config.yaml` (its top-level mapping).

    A document without `vnpus` configures no chips (Volcano registers none then); pass
    `DEFAULT_VNPUS` yourself when there is no ConfigMap at all.
    """
    volcano = is_volcano_compat(compat)
    try:
        if not isinstance(document, Mapping):
            raise VnpuConfigError(f"device-config.yaml: must be a mapping, not {type(document).__name__}")
        if document.get("vnpus") is None:
            return VnpusConfig(hami_vnpu_core=False, chips=())
        return _Reader(strict=not volcano).section(document["vnpus"])
    except VnpuConfigError:
        if volcano:
            return DEFAULT_VNPUS  # the ConfigMap fails to load as a whole: Volcano's default
        raise
