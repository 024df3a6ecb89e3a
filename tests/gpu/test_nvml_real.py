"""NvmlBackend against the real driver: run on a GPU machine with `pytest -m gpu`; skipped elsewhere."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from deviceplugin.fit.topology import decode_topology
from deviceplugin.gpu import mig
from deviceplugin.gpu.base import BackendError, MigError, XidEvent
from deviceplugin.gpu.nvml import NvmlBackend

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
