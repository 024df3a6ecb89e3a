"""NVIDIA's MIG profile tables and the built-in `knownMigGeometries` made from them.

Data only, so both sides read one table: the node's GPU layer (`deviceplugin.gpu.mig`: placing
and matching instances) and the scheduler extender (its default geometries), which must not
import the GPU layer.

Figures: profile names, instance counts and placements as NVIDIA's MIG user guide lists them
(`nvidia-smi mig -lgip` / `-lgipp`); placements are in memory slices (8 on A100/H100/H200, 4 on
A30), so a 3g instance spans 4 and 7g spans 8. Memory is NVML's `memorySizeMB` as published
`-lgip` output shows it (GiB to two decimals); it moves by a few MiB between driver releases, so
nothing matches on memory: the backends report each MIG device's memory from the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deviceplugin.fit.model import MigGeometry, MigGroup, MigInstance


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of a model."""

    name: str  # as NVIDIA publishes it, e.g. "3g.40gb"
    nvml_profile: str  # the pynvml constant passed to nvmlDeviceGetGpuInstanceProfileInfo
    slices: int  # compute slices (the "Ng"); its full compute instance has as many
    span: int  # memory slices one placement covers
    starts: tuple[int, ...]  # allowed placement starts
    max_count: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class MigModel:
    """A MIG-capable card: the product-name fragments it goes by and its profile table."""

    key: str  # e.g. "A100 80GB"
    family: str  # fragment of NVML's product name, e.g. "A100"
    memory_mib: int  # nominal total, to tell the 40 GB and 80 GB A100 apart
    names: tuple[str, ...]  # knownMigGeometries `models` (fragments of the product name)
    profiles: tuple[MigProfile, ...]
    groups: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]  # the built-in geometry groups

    def find(self, name: str) -> MigProfile | None:
        return next((profile for profile in self.profiles if profile.name == name), None)

    def memory(self, name: str) -> int:
        """A profile's memory, for the built-in groups (which name only the model's profiles)."""
        found = self.find(name)
        assert found is not None, f"{name} is not a profile of the {self.key}"
        return found.memory_mib


def _eight_slice_profiles(names: tuple[str, ...], memory: tuple[int, ...]) -> tuple[MigProfile, ...]:
    """A100, H100 and H200 share one layout: 7 compute slices over 8 memory slices."""
    shapes = (
        ("NVML_GPU_INSTANCE_PROFILE_1_SLICE", 1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),  # +me
        ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2", 1, 2, (0, 2, 4, 6), 4),  # 1g, double memory
        ("NVML_GPU_INSTANCE_PROFILE_2_SLICE", 2, 2, (0, 2, 4), 3),
        ("NVML_GPU_INSTANCE_PROFILE_3_SLICE", 3, 4, (0, 4), 2),
        ("NVML_GPU_INSTANCE_PROFILE_4_SLICE", 4, 4, (0,), 1),
        ("NVML_GPU_INSTANCE_PROFILE_7_SLICE", 7, 8, (0,), 1),
    )
    return tuple(
        MigProfile(name, nvml, slices, span, starts, count, mib)
        for name, mib, (nvml, slices, span, starts, count) in zip(names, memory, shapes, strict=True)
    )


def _hami_groups(names: tuple[str, ...]) -> tuple[tuple[str, tuple[tuple[str, int], ...]], ...]:
    """The HAMi vGPU plugin's default groups: all 1g; 2g x3 + 1g; 3g x2; the whole card."""
    small, _me, _double, two, three, _four, seven = names
    return (
        ("group1", ((small, 7),)),
        ("group2", ((two, 3), (small, 1))),
        ("group3", ((three, 2),)),
        ("group4", ((seven, 1),)),
    )


# Names per model in the order of _eight_slice_profiles: 1g, 1g+me, 1g with double memory, 2g,
# 3g, 4g, 7g.
_A100_40 = ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
_A100_80 = ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
_H100_80 = _A100_80
_H200 = ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")
_A30 = ("1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb")

MIG_MODELS: tuple[MigModel, ...] = (
    MigModel(
        "A30 24GB",
        "A30",
        24576,
        ("A30",),
        (
            MigProfile(_A30[0], "NVML_GPU_INSTANCE_PROFILE_1_SLICE", 1, 1, (0, 1, 2, 3), 4, 5952),
            MigProfile(_A30[1], "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", 1, 1, (0, 1, 2, 3), 1, 5952),
            MigProfile(_A30[2], "NVML_GPU_INSTANCE_PROFILE_2_SLICE", 2, 2, (0, 2), 2, 11968),
            MigProfile(_A30[3], "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1", 2, 2, (0, 2), 1, 11968),
            MigProfile(_A30[4], "NVML_GPU_INSTANCE_PROFILE_4_SLICE", 4, 4, (0,), 1, 24064),
        ),
        (("group1", ((_A30[0], 4),)), ("group2", ((_A30[2], 2),)), ("group3", ((_A30[4], 1),))),
    ),
    MigModel(
        "A100 40GB",
        "A100",
        40960,
        ("A100-SXM4-40GB", "A100-PCIE-40GB", "A100-40GB-PCIe"),
        _eight_slice_profiles(_A100_40, (4864, 4864, 9856, 9856, 19968, 19968, 40192)),
        _hami_groups(_A100_40),
    ),
    MigModel(
        "A100 80GB",
        "A100",
        81920,
        ("A100-SXM4-80GB", "A100-PCIE-80GB", "A100-80GB-PCIe", "A100 80GB PCIe"),
        _eight_slice_profiles(_A100_80, (9728, 9728, 19968, 19968, 40192, 40192, 80896)),
        _hami_groups(_A100_80),
    ),
    MigModel(
        "H100 80GB",
        "H100",
        81559,
        ("H100 80GB HBM3", "H100 PCIe"),
        _eight_slice_profiles(_H100_80, (9984, 9984, 20096, 20096, 40448, 40448, 81152)),
        _hami_groups(_H100_80),
    ),
    MigModel(
        "H200 141GB",
        "H200",
        143771,
        ("H200",),
        # 1g.35gb, 3g.71gb and 4g.71gb: no published -lgip figure found; 1g.35gb as 2g.35gb (as
        # 1g.20gb is 2g.20gb on the H100), the 4-slice ones 65.5 GiB: estimates.
        _eight_slice_profiles(_H200, (16384, 16384, 33280, 33280, 67072, 67072, 143360)),
        _hami_groups(_H200),
    ),
)


# --- the built-in knownMigGeometries -------------------------------------------------------------


def known_mig_geometries() -> list[dict[str, Any]]:
    """The built-in default in the HAMi vGPU plugin's `knownMigGeometries` YAML shape, memory as
    NVML reports it (HAMi's own default has nominal sizes for the A30 and the A100 40GB)."""
    return [
        {
            "models": list(model.names),
            "allowedGeometries": [
                {
                    "group": group,
                    "geometries": [
                        {"name": name, "memory": model.memory(name), "count": count}
                        for name, count in instances
                    ],
                }
                for group, instances in model.groups
            ],
        }
        for model in MIG_MODELS
    ]


def builtin_geometries() -> tuple[MigGeometry, ...]:
    """The same default as the fit library's type."""
    return tuple(
        MigGeometry(
            model.names,
            tuple(
                MigGroup(
                    group,
                    tuple(MigInstance(name, model.memory(name), count) for name, count in instances),
                )
                for group, instances in model.groups
            ),
        )
        for model in MIG_MODELS
    )
