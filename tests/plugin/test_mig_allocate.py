"""vGPU Allocate on a `mig` node (issue 16 item 2, docs/mig.md), in process against the API-server
emulator with a real ledger, on a fake H100 80GB in MIG mode: the scheduler's slot
`GPU-<uuid>[<group>-<pos>]` becomes the container's MIG device, the card partitioned into the group
when it holds no pod; every refusal leaves the card and the ledger as they were."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.fit import keys
from deviceplugin.fit.model import MigGeometry, MigGroup, MigInstance
from deviceplugin.gpu.base import GpuInfo, Inventory
from deviceplugin.gpu.fake import FakeBackend
from deviceplugin.gpu.mig import builtin_geometries
from deviceplugin.plugin.devices import RESOURCES, DeviceList, Layout
from deviceplugin.plugin.families import node_family_of
from deviceplugin.plugin.vgpu import VgpuAllocator
from deviceplugin.plugin.vgpumig import MigCards
from kubesim.apiserver import ApiServerEmulator
from tests.plugin.rig import WAIT_S, Rig, close_rig, envs, fails, make_rig
from tests.plugin.test_vgpu_allocate import refused, settled, vpod

H100 = GpuInfo(0, "GPU-h100", "NVIDIA H100 80GB HBM3", 81559, mig_enabled=True)
A100 = GpuInfo(1, "GPU-a100", "NVIDIA A100-SXM4-80GB", 81920, mig_enabled=True)
GPUS = (H100, A100)


def mig_rig(
    tmp_path: Path,
    apiserver: ApiServerEmulator,
    geometries: Sequence[MigGeometry] = builtin_geometries(),
    layouts: dict[str, tuple[str, ...]] | None = None,
) -> tuple[Rig, FakeBackend]:
    """The rig's pieces with a vgpu-number allocator of a mig node over fake MIG cards."""
    rig = make_rig(tmp_path, apiserver, "vgpu", gpus=GPUS)
    backend = FakeBackend(Inventory(GPUS), None, layouts)
    cards = MigCards(backend, GPUS, geometries)
    assert cards.problems == []
    devices = DeviceList(RESOURCES["vgpu"][0], GPUS, Layout(split_count=7))
    rig.allocator = VgpuAllocator(
        devices,
        rig.health,
        rig.pods,
        rig.ledger,
        rig.events,
        hook_path=rig.allocator.hook,  # type: ignore[attr-defined]
        mig=cards,
        node_name=rig.allocator.node_name,
        timeout_s=1.0,
        on_outbox=rig.outbox.wake,
    )
    return rig, backend


@pytest.fixture
def mig(tmp_path: Path, apiserver: ApiServerEmulator) -> Iterator[tuple[Rig, FakeBackend]]:
    rig, backend = mig_rig(tmp_path, apiserver)
    yield rig, backend
    close_rig(rig)


def slot(group: str, position: int, card: GpuInfo = H100, memory: int = 9000) -> list[tuple[str, int, int]]:
    return [(f"{card.uuid}[{group}-{position}]", memory, 0)]


def mig_pod(rig: Rig, name: str, group: str, position: int, card: GpuInfo = H100, **more: Any) -> None:
    more.setdefault("annotations", {"volcano.sh/vgpu-mode": "mig"})
    vpod(rig, name, [("cuda", slot(group, position, card))], **more)


def uuids(backend: FakeBackend, card: GpuInfo = H100) -> dict[int, str]:
    return {device.gpu_instance: device.uuid for device in backend.mig_devices(card.uuid)}


def group_of(backend: FakeBackend, card: GpuInfo = H100) -> str | None:
    match = backend.match_mig(card.uuid, [g for geometry in builtin_geometries() for g in geometry.groups])
    return None if match is None else match.group


# --- serving ------------------------------------------------------------------------------------


def test_a_first_pod_partitions_the_empty_card_and_gets_its_mig_device(mig: tuple[Rig, FakeBackend]) -> None:
    rig, backend = mig
    assert backend.mig_devices(H100.uuid) == ()
    mig_pod(rig, "first", "group3", 1)
    response = rig.allocator.allocate([f"{H100.uuid}-0"])
    assert group_of(backend) == "group3"  # two 3g.40gb instances
    second = backend.match_mig(H100.uuid, builtin_geometries()[3].groups)
    assert second is not None
    assert envs(response) == {"NVIDIA_VISIBLE_DEVICES": second.devices[1].uuid}
    assert second.devices[1].uuid.startswith("MIG-")
    assert list(response.mounts) == []  # no HAMi-core library, preload, cache or lock
    (row,) = rig.ledger.active()
    assert [(g.uuid, g.memory) for g in row.gpus] == [(H100.uuid, 9000)]  # the card, the slot's memory
    notes = settled(rig, "first", "success")
    assert notes["volcano.sh/devices-to-allocate"] == ""


def test_a_second_pod_in_the_same_group_reuses_the_partition(mig: tuple[Rig, FakeBackend]) -> None:
    rig, backend = mig
    mig_pod(rig, "one", "group1", 0, vgpu_time=1)
    mig_pod(rig, "two", "group1", 5, vgpu_time=2)
    first = rig.allocator.allocate([f"{H100.uuid}-0"])
    partitioned = uuids(backend)
    assert len(partitioned) == 7
    second = rig.allocator.allocate([f"{H100.uuid}-1"])
    assert uuids(backend) == partitioned  # nothing destroyed or created
    match = backend.match_mig(H100.uuid, builtin_geometries()[3].groups)
    assert match is not None and match.group == "group1"
    assert envs(first)["NVIDIA_VISIBLE_DEVICES"] == match.devices[0].uuid
    assert envs(second)["NVIDIA_VISIBLE_DEVICES"] == match.devices[5].uuid
    assert [a.pod_name for a in rig.ledger.active()] == ["one", "two"]


def test_a_card_partitioned_before_in_the_group_is_used_as_it_is(
    tmp_path: Path, apiserver: ApiServerEmulator
) -> None:
    rig, backend = mig_rig(tmp_path, apiserver, layouts={H100.uuid: ("3g.40gb", "3g.40gb")})
    try:
        before = uuids(backend)
        mig_pod(rig, "as-is", "group3", 0)
        response = rig.allocator.allocate([f"{H100.uuid}-0"])
        assert uuids(backend) == before
        assert envs(response)["NVIDIA_VISIBLE_DEVICES"] in before.values()
    finally:
        close_rig(rig)


def test_an_idle_card_is_repartitioned_for_another_group(mig: tuple[Rig, FakeBackend]) -> None:
    rig, backend = mig
    mig_pod(rig, "small", "group1", 0)
    rig.allocator.allocate([f"{H100.uuid}-0"])
    assert group_of(backend) == "group1"
    uid = rig.ledger.active()[0].pod_uid
    rig.apiserver.delete("pods", "small", "ml")
    assert rig.pods.wait_until(lambda cache: cache.get(uid) is None, WAIT_S)
    rig.ledger.release_pod(uid, "deleted")  # as the release loop does for a deleted pod
    mig_pod(rig, "big", "group4", 0, vgpu_time=2)
    response = rig.allocator.allocate([f"{H100.uuid}-1"])
    assert group_of(backend) == "group4"  # the whole card: 7g.80gb
    (device,) = backend.mig_devices(H100.uuid)
    assert device.profile == "7g.80gb"
    assert envs(response) == {"NVIDIA_VISIBLE_DEVICES": device.uuid}


# --- refusals: the card and the ledger stay as they were -----------------------------------------


def test_another_group_on_a_card_holding_pods_is_refused(mig: tuple[Rig, FakeBackend]) -> None:
    rig, backend = mig
    mig_pod(rig, "tenant", "group1", 0)
    rig.allocator.allocate([f"{H100.uuid}-0"])
    before, rows = uuids(backend), rig.ledger.active()
    mig_pod(rig, "intruder", "group3", 0, vgpu_time=2)
    fails(
        rig,
        [f"{H100.uuid}-1"],
        grpc.StatusCode.FAILED_PRECONDITION,
        "GPU 0 (GPU-h100) holds pods in MIG group group1; it takes MIG group group3 only once they are gone",
    )
    assert settled(rig, "intruder", "failed")["volcano.sh/bind-phase"] == "failed"
    assert any(e["reason"] == "GpuAllocationFailed" for e in rig.events_about("intruder"))
    assert uuids(backend) == before
    assert rig.ledger.active() == rows


@pytest.mark.parametrize(
    ("group", "position", "fragments"),
    [
        ("group3", 2, ("MIG slot group3-2 on GPU 0 (GPU-h100): group group3 has 2 slot(s), 0 to 1",)),
        ("group9", 0, ("group 'group9' is not one of the NVIDIA H100 80GB HBM3's groups", "group1, group2")),
    ],
)
def test_a_slot_not_in_the_geometry_is_refused(
    mig: tuple[Rig, FakeBackend], group: str, position: int, fragments: tuple[str, ...]
) -> None:
    rig, backend = mig
    mig_pod(rig, "astray", group, position)
    refused(rig, "astray", [f"{H100.uuid}-0"], grpc.StatusCode.INVALID_ARGUMENT, *fragments)
    assert backend.mig_devices(H100.uuid) == ()


def test_a_group_the_cards_model_cannot_hold_is_refused(tmp_path: Path, apiserver: ApiServerEmulator) -> None:
    """knownMigGeometries may name profiles of another model: the H200's 1g.18gb is no H100 profile."""
    odd = MigGeometry(("H100",), (MigGroup("odd", (MigInstance("1g.18gb", 18432, 7),)),))
    rig, backend = mig_rig(tmp_path, apiserver, geometries=(odd, *builtin_geometries()))
    try:
        mig_pod(rig, "odd", "odd", 0)
        refused(
            rig,
            "odd",
            [f"{H100.uuid}-0"],
            grpc.StatusCode.INTERNAL,
            "cannot be partitioned into MIG group odd: 1g.18gb is not a MIG profile of the H100 80GB",
        )
        assert backend.mig_devices(H100.uuid) == ()
    finally:
        close_rig(rig)


def test_a_create_the_driver_fails_leaves_no_instance(mig: tuple[Rig, FakeBackend]) -> None:
    rig, backend = mig
    backend.fail_mig_create(H100.uuid, "Insufficient Resources", after=2)  # the third of four
    mig_pod(rig, "unlucky", "group2", 3)
    refused(
        rig,
        "unlucky",
        [f"{H100.uuid}-0"],
        grpc.StatusCode.INTERNAL,
        "GPU 0 (GPU-h100) cannot be partitioned into MIG group group2",
        "Insufficient Resources",
    )
    assert backend.mig_devices(H100.uuid) == ()  # the two created first were removed again


def test_a_card_whose_instance_is_in_use_outside_the_ledger_is_refused(
    tmp_path: Path, apiserver: ApiServerEmulator
) -> None:
    rig, backend = mig_rig(tmp_path, apiserver, layouts={H100.uuid: ("3g.40gb", "3g.40gb")})
    try:
        before = uuids(backend)
        backend.set_mig_busy(H100.uuid, 1)  # a process the ledger does not know holds it
        mig_pod(rig, "blocked", "group1", 0)
        refused(
            rig,
            "blocked",
            [f"{H100.uuid}-0"],
            grpc.StatusCode.FAILED_PRECONDITION,
            "GPU 0 (GPU-h100) cannot be repartitioned into MIG group group1",
        )
        assert uuids(backend) == before
    finally:
        close_rig(rig)


def test_a_whole_card_slot_or_a_hami_core_pod_is_refused_on_a_mig_node(mig: tuple[Rig, FakeBackend]) -> None:
    rig, backend = mig
    vpod(rig, "whole", [("cuda", [(H100.uuid, 9000, 0)])])
    refused(
        rig, "whole", [f"{H100.uuid}-0"], grpc.StatusCode.INVALID_ARGUMENT, "the node runs mig", "not a MIG"
    )
    mig_pod(rig, "shared", "group1", 0, annotations={"volcano.sh/vgpu-mode": "hami-core"}, vgpu_time=2)
    refused(rig, "shared", [f"{H100.uuid}-1"], grpc.StatusCode.INVALID_ARGUMENT, "runs mig only")
    assert backend.mig_devices(H100.uuid) == ()


def test_a_mig_slot_is_refused_on_a_hami_core_node(vgpu: Rig) -> None:
    vpod(vgpu, "lost", [("cuda", [("GPU-000[group1-0]", 1000, 0)])])
    refused(
        vgpu, "lost", ["GPU-000-0"], grpc.StatusCode.INVALID_ARGUMENT, "MIG slot", "the node runs hami-core"
    )


# --- the node: registration and the start check ---------------------------------------------------


def test_a_mig_node_registers_every_card_as_mig_and_uses_no_hook() -> None:
    family = node_family_of("vgpu", keys.MODE_MIG)
    state = family.node_state(GPUS, {H100.uuid: True, A100.uuid: True}, Layout(split_count=7))
    register = state.annotations[keys.NODE_VGPU_REGISTER]
    assert register == (
        "GPU-h100,7,81559,NVIDIA-NVIDIA H100 80GB HBM3,true,mig:"
        "GPU-a100,7,81920,NVIDIA-NVIDIA A100-SXM4-80GB,true,mig:"
    )
    assert family.uses_hook is False
    assert node_family_of("vgpu").uses_hook is True


def test_cards_that_cannot_run_mig_are_named_at_start() -> None:
    off = GpuInfo(0, "GPU-off", "NVIDIA A100-SXM4-80GB", 81920, mig_enabled=False)
    a10 = GpuInfo(1, "GPU-a10", "NVIDIA A10", 23028, mig_enabled=False)
    h100 = GpuInfo(2, "GPU-h", "NVIDIA H100 80GB HBM3", 81559, mig_enabled=True)
    only_a100 = tuple(g for g in builtin_geometries() if "A100-SXM4-80GB" in g.models)
    cards = MigCards(FakeBackend(Inventory((off, a10, h100))), (off, a10, h100), only_a100)
    problems = "\n".join(cards.problems)
    assert (
        "GPU 0 (GPU-off, NVIDIA A100-SXM4-80GB): MIG mode is off (enable it: nvidia-smi -i 0 -mig 1"
        in problems
    )
    assert "GPU 1 (GPU-a10, NVIDIA A10): dynamic MIG has no profile table for this model" in problems
    assert "GPU 2 (GPU-h, NVIDIA H100 80GB HBM3): no knownMigGeometries entry names it" in problems
    assert len(cards.problems) == 3
