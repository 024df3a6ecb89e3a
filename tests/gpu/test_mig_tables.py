"""NVIDIA's MIG tables as the backends use them: which table a card gets, each profile's capacity,
and the built-in knownMigGeometries as the HAMi config reader and the fit library take it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deviceplugin.fit.mig import geometry_for
from deviceplugin.fit.model import MigGroup, MigInstance
from deviceplugin.gpu import mig
from deviceplugin.gpu.base import MigError
from deviceplugin.upstream.hami import read_device_config


@pytest.mark.parametrize(
    ("product", "memory_mib", "key"),
    [
        ("NVIDIA A30", 24576, "A30 24GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100 40GB"),
        ("NVIDIA A100-PCIE-40GB", 40960, "A100 40GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100 80GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100 80GB"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100 80GB"),
        ("NVIDIA H200", 143771, "H200 141GB"),
        ("NVIDIA H100 NVL", 95830, None),  # 94 GB: other profiles (1g.12gb, ...)
        ("NVIDIA A10", 23028, None),
        ("Fake GPU", 81920, None),
    ],
)
def test_model_for_a_card(product: str, memory_mib: int, key: str | None) -> None:
    model = mig.model_for(product, memory_mib)
    assert (model.key if model else None) == key


@pytest.mark.parametrize(
    ("model", "profile"),
    [(model, profile) for model in mig.MIG_MODELS for profile in model.profiles],
    ids=lambda item: getattr(item, "key", None) or getattr(item, "name", ""),
)
def test_each_profile_holds_exactly_its_published_instance_count(
    model: mig.MigModel, profile: mig.MigProfile
) -> None:
    """`max_count` instances of a profile fit the card's placements and one more does not."""
    full = MigGroup("full", (MigInstance(profile.name, 0, profile.max_count),))
    assert len(mig.plan(model, full)) == profile.max_count
    one_more = MigGroup("more", (MigInstance(profile.name, 0, profile.max_count + 1),))
    with pytest.raises(MigError, match=f"holds at most {profile.max_count}"):
        mig.plan(model, one_more)


def test_placements_as_nvidia_lists_them_for_the_h100() -> None:
    """`nvidia-smi mig -lgipp` on an H100 80GB (NVIDIA's MIG user guide):
    19 {0..6}:1, 20 {0..6}:1, 15 {0,2,4,6}:2, 14 {0,2,4}:2, 9 {0,4}:4, 5 {0}:4, 0 {0}:8."""
    model = mig.require_model("NVIDIA H100 80GB HBM3", 81559)
    assert [(p.name, p.starts, p.span) for p in model.profiles] == [
        ("1g.10gb", (0, 1, 2, 3, 4, 5, 6), 1),
        ("1g.10gb+me", (0, 1, 2, 3, 4, 5, 6), 1),
        ("1g.20gb", (0, 2, 4, 6), 2),
        ("2g.20gb", (0, 2, 4), 2),
        ("3g.40gb", (0, 4), 4),
        ("4g.40gb", (0,), 4),
        ("7g.80gb", (0,), 8),
    ]


def test_a_misfit_names_the_group_and_the_model() -> None:
    model = mig.require_model("NVIDIA A30", 24576)
    with pytest.raises(
        MigError, match=r"no free placement for group g \(4g\.24gb x1 \+ 1g\.6gb x1\) on the A30"
    ):
        mig.plan(model, MigGroup("g", (MigInstance("4g.24gb", 0, 1), MigInstance("1g.6gb", 0, 1))))


def test_create_all_undoes_what_it_created() -> None:
    created: list[int] = []
    model = mig.require_model("NVIDIA A30", 24576)
    steps = mig.plan(model, MigGroup("g", (MigInstance("1g.6gb", 0, 4),)))

    def create(profile: mig.MigProfile, start: int) -> int:
        if len(created) == 3:
            raise MigError("the driver said no")
        created.append(start)
        return start

    with pytest.raises(MigError, match=r"^the driver said no$"):
        mig.create_all(steps, create, created.remove)
    assert created == []


def test_builtin_geometries_pass_the_hami_config_reader(tmp_path: Path) -> None:
    config = tmp_path / "device-config.yaml"
    config.write_text(yaml.safe_dump({"nvidia": {"knownMigGeometries": mig.known_mig_geometries()}}))
    notes = read_device_config(config).notes
    assert any("nvidia.knownMigGeometries: 5 model(s) checked" in note for note in notes)


def test_builtin_geometries_are_the_yaml_default() -> None:
    as_yaml = [
        {
            "models": list(geometry.models),
            "allowedGeometries": [
                {
                    "group": group.name,
                    "geometries": [
                        {"name": i.name, "memory": i.memory, "count": i.count} for i in group.instances
                    ],
                }
                for group in geometry.groups
            ],
        }
        for geometry in mig.builtin_geometries()
    ]
    assert as_yaml == mig.known_mig_geometries()


@pytest.mark.parametrize(
    ("card_type", "first_group"),
    [
        ("NVIDIA-NVIDIA A100-SXM4-80GB", ("1g.10gb", 9728, 7)),
        ("NVIDIA-NVIDIA A100-SXM4-40GB", ("1g.5gb", 4864, 7)),
        ("NVIDIA-NVIDIA H100 80GB HBM3", ("1g.10gb", 9984, 7)),
        ("NVIDIA-NVIDIA H200", ("1g.18gb", 16384, 7)),
        ("NVIDIA-NVIDIA A30", ("1g.6gb", 5952, 4)),
    ],
)
def test_fit_library_finds_each_models_default(card_type: str, first_group: tuple[str, int, int]) -> None:
    geometry = geometry_for(card_type, mig.builtin_geometries())
    assert geometry is not None
    (instance,) = geometry.groups[0].instances
    assert (instance.name, instance.memory, instance.count) == first_group
