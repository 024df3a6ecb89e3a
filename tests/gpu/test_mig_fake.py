"""Dynamic MIG on fake GPUs: what the daemon's Allocate will rely on when it partitions a card,
finds the MIG device of a slot, or uses a card an operator partitioned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.fit.model import MigGroup, MigInstance
from deviceplugin.gpu import mig
from deviceplugin.gpu.base import BackendError, MigBusy, MigError, MigMatch
from deviceplugin.gpu.fake import FakeBackend, fake_mig_uuid

H100 = "GPU-00000000-0000-0000-0000-000000000001"
A100_SPLIT = "GPU-00000000-0000-0000-0000-000000000002"
A10 = "GPU-00000000-0000-0000-0000-000000000003"
WHOLE = "GPU-00000000-0000-0000-0000-000000000004"
CARDS: list[dict[str, Any]] = [
    {"uuid": H100, "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "mig_enabled": True},
    {
        "uuid": A100_SPLIT,
        "model": "NVIDIA A100-SXM4-40GB",
        "memory_mib": 40960,
        "mig_enabled": True,
        "mig_instances": ["3g.20gb", "3g.20gb"],
    },
    {"uuid": A10, "model": "NVIDIA A10", "memory_mib": 23028, "mig_enabled": True},
    {"uuid": WHOLE, "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559},
]
H100_GROUPS = next(g for g in mig.builtin_geometries() if "H100 80GB HBM3" in g.models).groups
A100_40_GROUPS = next(g for g in mig.builtin_geometries() if "A100-SXM4-40GB" in g.models).groups


def group(name: str, *instances: tuple[str, int]) -> MigGroup:
    return MigGroup(name, tuple(MigInstance(profile, 0, count) for profile, count in instances))


def write_spec(tmp_path: Path, cards: list[dict[str, Any]]) -> str:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(cards))
    return str(path)


@pytest.fixture
def spec(tmp_path: Path) -> str:
    return write_spec(tmp_path, CARDS)


@pytest.fixture
def backend(spec: str) -> FakeBackend:
    return FakeBackend.from_spec(spec)


def placed(devices: tuple[Any, ...]) -> list[tuple[str, int]]:
    return [(device.profile, device.start) for device in devices]


# --- partition and slot order --------------------------------------------------------------------


def test_partition_gives_the_devices_in_slot_order(backend: FakeBackend) -> None:
    devices = backend.partition(H100, H100_GROUPS[1])  # group2: 2g.20gb x3, 1g.10gb x1
    assert placed(devices) == [("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)]
    assert [d.memory_mib for d in devices] == [20096, 20096, 20096, 9984]
    assert [d.uuid for d in devices] == [fake_mig_uuid(H100, d.gpu_instance) for d in devices]
    assert len({d.uuid for d in devices}) == 4
    assert backend.mig_devices(H100) == devices  # by position, which is slot order here


def test_slot_order_follows_the_group_not_the_card(backend: FakeBackend) -> None:
    """Slot 0 of a group listing 1g first is the 1g instance, wherever the card placed it."""
    devices = backend.partition(H100, group("g", ("1g.10gb", 1), ("2g.20gb", 3)))
    assert placed(devices) == [("1g.10gb", 6), ("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4)]
    assert placed(backend.mig_devices(H100)) == [
        ("2g.20gb", 0),
        ("2g.20gb", 2),
        ("2g.20gb", 4),
        ("1g.10gb", 6),
    ]


def test_wide_instances_are_placed_first(backend: FakeBackend) -> None:
    """1g then 4g in the group: a 1g placed first at slice 0 would leave the 4g no room."""
    devices = backend.partition(H100, group("g", ("1g.10gb", 3), ("4g.40gb", 1)))
    assert placed(devices) == [("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6), ("4g.40gb", 0)]


def test_mig_uuids_are_the_same_in_every_run(spec: str) -> None:
    first = FakeBackend.from_spec(spec).partition(H100, H100_GROUPS[0])
    again = FakeBackend.from_spec(spec).partition(H100, H100_GROUPS[0])
    assert [d.uuid for d in first] == [d.uuid for d in again]


@pytest.mark.parametrize("model", mig.MIG_MODELS, ids=lambda model: model.key)
def test_every_built_in_group_partitions_its_model(tmp_path: Path, model: mig.MigModel) -> None:
    card = {
        "uuid": H100,
        "model": f"NVIDIA {model.names[0]}",
        "memory_mib": model.memory_mib,
        "mig_enabled": True,
    }
    backend = FakeBackend.from_spec(write_spec(tmp_path, [card]))
    (geometry,) = [g for g in mig.builtin_geometries() if g.models == model.names]
    for each in geometry.groups:
        devices = backend.partition(H100, each)
        assert [d.profile for d in devices] == mig.group_profiles(each)
        assert backend.match_mig(H100, geometry.groups) == MigMatch(each.name, devices)
        backend.clear_mig(H100)
        assert backend.mig_devices(H100) == ()


# --- a card partitioned by its operator -----------------------------------------------------------


def test_pre_partitioned_card_matches_its_group(backend: FakeBackend) -> None:
    found = backend.match_mig(A100_SPLIT, A100_40_GROUPS)
    assert found is not None
    assert found.group == "group3"
    assert placed(found.devices) == [("3g.20gb", 0), ("3g.20gb", 4)]


def test_pre_partitioned_card_matching_no_group(tmp_path: Path) -> None:
    card = dict(CARDS[1], mig_instances=["4g.20gb", "2g.10gb", "1g.5gb"])
    backend = FakeBackend.from_spec(write_spec(tmp_path, [card]))
    assert backend.match_mig(A100_SPLIT, A100_40_GROUPS) is None
    assert (
        mig.layout(d.profile for d in backend.mig_devices(A100_SPLIT))
        == "4g.20gb x1 + 2g.10gb x1 + 1g.5gb x1"
    )


def test_empty_card_matches_no_group(backend: FakeBackend) -> None:
    assert backend.match_mig(H100, H100_GROUPS) is None


def test_a_partitioned_card_is_not_partitioned_again(backend: FakeBackend) -> None:
    with pytest.raises(MigError, match=r"already holds 3g\.20gb x2; its instances must be destroyed"):
        backend.partition(A100_SPLIT, A100_40_GROUPS[0])
    assert placed(backend.mig_devices(A100_SPLIT)) == [("3g.20gb", 0), ("3g.20gb", 4)]


# --- refusals that leave the card as it was ------------------------------------------------------


def test_busy_instance_refuses_clearing_and_destroys_nothing(backend: FakeBackend) -> None:
    before = backend.mig_devices(A100_SPLIT)
    busy = before[1]
    backend.set_mig_busy(A100_SPLIT, busy.gpu_instance)
    with pytest.raises(
        MigBusy, match=f"MIG device {busy.uuid} \\(3g.20gb, GPU instance 2\\) is in use"
    ) as err:
        backend.clear_mig(A100_SPLIT)
    assert err.value.device == busy
    assert backend.mig_devices(A100_SPLIT) == before
    backend.set_mig_busy(A100_SPLIT, busy.gpu_instance, busy=False)
    backend.clear_mig(A100_SPLIT)
    assert backend.mig_devices(A100_SPLIT) == ()


def test_failed_create_leaves_nothing_half_created(backend: FakeBackend) -> None:
    backend.fail_mig_create(H100, "Unknown Error", after=2)
    with pytest.raises(MigError, match=r"creating a 2g\.20gb GPU instance on GPU .* failed: Unknown Error$"):
        backend.partition(H100, H100_GROUPS[1])
    assert backend.mig_devices(H100) == ()
    assert len(backend.partition(H100, H100_GROUPS[1])) == 4  # the failure was once


def test_unsupported_model(backend: FakeBackend) -> None:
    with pytest.raises(
        MigError, match=r"dynamic MIG does not know the NVIDIA A10 \(23028 MiB\); supported: A30"
    ):
        backend.partition(A10, H100_GROUPS[0])
    assert backend.mig_devices(A10) == ()


def test_profile_not_in_the_models_table(backend: FakeBackend) -> None:
    with pytest.raises(
        MigError, match=r"^1g\.5gb is not a MIG profile of the H100 80GB \(its profiles: 1g\.10gb, "
    ):
        backend.partition(H100, A100_40_GROUPS[0])
    assert backend.mig_devices(H100) == ()


def test_instances_that_do_not_fit_together(backend: FakeBackend) -> None:
    with pytest.raises(
        MigError, match=r"no free placement for group g \(3g\.40gb x2 \+ 1g\.10gb x1\) on the H100"
    ):
        backend.partition(H100, group("g", ("3g.40gb", 2), ("1g.10gb", 1)))
    assert backend.mig_devices(H100) == ()


def test_more_instances_than_the_profile_allows(backend: FakeBackend) -> None:
    with pytest.raises(MigError, match=r"group g asks 2 x 1g\.10gb\+me; the H100 80GB holds at most 1"):
        backend.partition(H100, group("g", ("1g.10gb+me", 2)))


def test_mig_mode_off(backend: FakeBackend) -> None:
    assert backend.mig_enabled(WHOLE) is False
    assert backend.mig_enabled(H100) is True
    with pytest.raises(MigError, match=f"^GPU {WHOLE} is not in MIG mode$"):
        backend.mig_devices(WHOLE)
    with pytest.raises(MigError, match="not in MIG mode"):
        backend.partition(WHOLE, H100_GROUPS[3])


def test_unknown_and_lost_gpus(backend: FakeBackend) -> None:
    with pytest.raises(MigError, match="no GPU GPU-x on this node"):
        backend.mig_enabled("GPU-x")
    backend.set_lost(H100, True)
    with pytest.raises(MigError, match=f"GPU {H100} is lost"):
        backend.mig_devices(H100)


# --- faults from another process ----------------------------------------------------------------


def test_events_file_marks_busy_and_fails_creates(spec: str, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    backend = FakeBackend.from_spec(spec, events)
    events.write_text(
        json.dumps({"mig_busy": A100_SPLIT, "gi": 1})
        + "\n"
        + json.dumps({"mig_fail": H100, "error": "Insufficient Resources"})
        + "\n"
    )
    with pytest.raises(MigBusy):
        backend.clear_mig(A100_SPLIT)
    with pytest.raises(MigError, match=r"failed: Insufficient Resources$"):
        backend.partition(H100, H100_GROUPS[3])
    with events.open("a") as stream:
        stream.write(json.dumps({"mig_busy": A100_SPLIT, "gi": 1, "busy": False}) + "\n")
    backend.clear_mig(A100_SPLIT)
    assert backend.mig_devices(A100_SPLIT) == ()


# --- the spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mig_enabled": False}, "mig_instances needs mig_enabled: true"),
        ({"mig_instances": "3g.20gb"}, "is not a list of MIG profile names"),
        ({"model": "NVIDIA A10"}, "dynamic MIG does not know the NVIDIA A10"),
        ({"mig_instances": ["7g.40gb", "1g.5gb"]}, "no free placement"),
        ({"mig_instances": ["9g.90gb"]}, "9g.90gb is not a MIG profile of the A100 40GB"),
    ],
)
def test_spec_refuses_a_pre_partition_the_card_cannot_hold(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(BackendError, match=f"GPU 0: .*{message}"):
        FakeBackend.from_spec(write_spec(tmp_path, [dict(CARDS[1], **change)]))
