"""NvmlBackend against the real driver: run on a GPU machine with `pytest -m gpu`; skipped elsewhere."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin.fit.mig import geometry_for
from deviceplugin.fit.mig_tables import builtin_geometries
from deviceplugin.fit.topology import decode_topology
from deviceplugin.gpu import mig
from deviceplugin.gpu.base import BackendError, MigError, XidEvent
from deviceplugin.gpu.mps import QUERY, MpsControl, MpsError, MpsRoot
from deviceplugin.gpu.nvml import NvmlBackend
from deviceplugin.plugin.nodestate import card_type

pytestmark = pytest.mark.gpu

UUID_SHAPE = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
BUS_ID_SHAPE = re.compile(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]")


@pytest.fixture(scope="module")
def backend() -> Iterator[NvmlBackend]:
    try:
        nvml = NvmlBackend()
    except BackendError as err:
        pytest.skip(f"no usable NVIDIA driver on this machine ({err})")
    yield nvml
    nvml.close()


@pytest.fixture(scope="module")
def uuids(backend: NvmlBackend) -> tuple[str, ...]:
    return tuple(gpu.uuid for gpu in backend.inventory().gpus)


def test_inventory(backend: NvmlBackend) -> None:
    inventory = backend.inventory()
    assert inventory.errors == ()
    assert len(inventory.gpus) >= 1
    for position, gpu in enumerate(inventory.gpus):
        assert gpu.index == position
        assert UUID_SHAPE.fullmatch(gpu.uuid), gpu.uuid
        assert gpu.model
        assert gpu.memory_mib > 0
        assert gpu.pci_bus_id is not None and BUS_ID_SHAPE.fullmatch(gpu.pci_bus_id), gpu.pci_bus_id
        assert gpu.numa is None or gpu.numa >= 0
        assert gpu.minor is None or gpu.minor >= 0


def test_watch_all_gpus(backend: NvmlBackend, uuids: tuple[str, ...]) -> None:
    assert backend.watch(uuids) == {}


def test_wait_event_does_not_raise(backend: NvmlBackend, uuids: tuple[str, ...]) -> None:
    backend.watch(uuids)
    event = backend.wait_event(0.2)
    assert event is None or isinstance(event, XidEvent)


def test_probe_every_gpu(backend: NvmlBackend, uuids: tuple[str, ...]) -> None:
    assert all(backend.probe(uuid) for uuid in uuids)
    assert not backend.probe("GPU-00000000-0000-0000-0000-000000000000")


def test_topology_of_every_gpu(backend: NvmlBackend, caplog: pytest.LogCaptureFixture) -> None:
    """The driver answers every topology query (nothing degraded to its worst), and the annotation
    round-trips; printed for the closing notes (`pytest -m gpu -s`)."""
    gpus = backend.inventory().gpus
    with caplog.at_level("WARNING", logger="deviceplugin.gpu.nvml_topology"):
        topology = backend.topology(gpus)
    assert caplog.records == []
    assert topology.gpus == tuple(gpu.index for gpu in gpus)
    assert all(node >= -1 for node in topology.numa)
    assert decode_topology(topology.encode()) == topology
    print(topology.encode())


# --- MIG, read-only: a card's MIG mode cannot be changed here -------------------------------------

MIG_UUID_SHAPE = re.compile(r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_mig_mode_of_every_gpu(backend: NvmlBackend) -> None:
    for gpu in backend.inventory().gpus:
        assert backend.mig_enabled(gpu.uuid) is gpu.mig_enabled


def test_mig_devices_and_their_uuids(backend: NvmlBackend) -> None:
    """On a card in MIG mode: every MIG device with a MIG UUID, a known profile and memory within
    the card's; on one that is not, a clear refusal."""
    for gpu in backend.inventory().gpus:
        if not gpu.mig_enabled:
            with pytest.raises(MigError, match="not in MIG mode"):
                backend.mig_devices(gpu.uuid)
            continue
        model = mig.model_for(gpu.model, gpu.memory_mib)
        if model is None:
            with pytest.raises(MigError, match="dynamic MIG does not know"):
                backend.mig_devices(gpu.uuid)
            continue
        devices = backend.mig_devices(gpu.uuid)
        assert [d.start for d in devices] == sorted(d.start for d in devices)
        assert len({d.uuid for d in devices}) == len(devices)
        for device in devices:
            assert MIG_UUID_SHAPE.fullmatch(device.uuid), device.uuid
            assert device.profile in {p.name for p in model.profiles}
            assert 0 < device.memory_mib <= gpu.memory_mib
        assert backend.match_mig(gpu.uuid, []) is None


# --- MIG, writing: only where asked, on a card already in MIG mode and holding no instance ------

MIG_WRITE = "DEVICEPLUGIN_GPU_MIG_WRITE"  # =1: partition and clear idle MIG cards


@pytest.mark.skipif(os.environ.get(MIG_WRITE) != "1", reason=f"partitions a card: set {MIG_WRITE}=1")
def test_an_idle_mig_card_takes_each_group_of_its_geometry_and_is_cleared(backend: NvmlBackend) -> None:
    """What Allocate does to a card that must be repartitioned: every group of the built-in
    geometry created, its devices in the group's slot order with MIG UUIDs, matched back to the
    group, then destroyed (the card is left as found: empty)."""
    cards = [gpu for gpu in backend.inventory().gpus if gpu.mig_enabled and not backend.mig_devices(gpu.uuid)]
    if not cards:
        pytest.skip("no card in MIG mode without instances")
    gpu = cards[0]
    geometry = geometry_for(card_type(gpu), builtin_geometries())
    assert geometry is not None, f"no built-in geometry for {gpu.model}"
    for group in geometry.groups:
        try:
            devices = backend.partition(gpu.uuid, group)
            assert [d.profile for d in devices] == [i.name for i in group.instances for _ in range(i.count)]
            assert all(MIG_UUID_SHAPE.fullmatch(d.uuid) for d in devices)
            match = backend.match_mig(gpu.uuid, geometry.groups)
            assert match is not None and match.group == group.name
        finally:
            backend.clear_mig(gpu.uuid)
        assert backend.mig_devices(gpu.uuid) == ()


# --- MPS: the driver's control daemon, under a temporary pipe directory -------------------------

MPS_CONTROL = shutil.which("nvidia-cuda-mps-control")


def mib(answer: str) -> float:
    """A size as the control daemon prints it (`3000M`, `2.9G`) in MiB."""
    units = {"M": 1.0, "G": 1024.0}
    assert answer[-1:] in units, answer
    return float(answer[:-1]) * units[answer[-1]]


@pytest.mark.skipif(MPS_CONTROL is None, reason="nvidia-cuda-mps-control is not on PATH")
def test_the_drivers_mps_control_daemon_takes_a_gpus_limits(
    backend: NvmlBackend, uuids: tuple[str, ...], tmp_path: Path
) -> None:
    """What the daemon does on an mps node: start the control daemon of one GPU, ask it the health
    query, set the limits a container cannot raise, read them back, and stop it."""
    assert MPS_CONTROL is not None
    control = MpsControl(MPS_CONTROL, MpsRoot(tmp_path / "mps"))
    uuid = uuids[0]
    control.start(uuid)
    try:
        assert control.ask(uuid, QUERY).replace(".", "", 1).isdigit()
        control.ask(uuid, "set_default_device_pinned_mem_limit 0 3000M")
        control.ask(uuid, "set_default_active_thread_percentage 30")
        assert mib(control.ask(uuid, "get_default_device_pinned_mem_limit 0")) == pytest.approx(3000)
        assert float(control.ask(uuid, QUERY)) == 30.0
        assert (control.root.pipe_dir(uuid) / "control").exists()
    finally:
        with contextlib.suppress(MpsError):
            control.ask(uuid, "quit")
