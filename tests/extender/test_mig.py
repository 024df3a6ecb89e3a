"""The extender on a MIG node (docs/mig.md, "The scheduler side"): a node registered as a `--vgpu-mode
mig` daemon writes it gets pods bound to MIG slots `GPU-<uuid>[<group>-<pos>]` of the geometries
the extender reads (`nvidia.knownMigGeometries` of --device-config, else the daemon's built-in
ones), byte for byte what the fit library decides for the same inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deviceplugin.extender.config import BUILTIN_MIG_GEOMETRIES, ExtenderConfigError, load_config
from deviceplugin.fit import (
    Compat,
    VgpuConfig,
    fit_vgpu,
    parse_vgpu_requests,
    vgpu_bind_annotations,
    vgpu_gpus,
)
from deviceplugin.fit import keys as k
from deviceplugin.fit.mig_tables import builtin_geometries, known_mig_geometries
from deviceplugin.fit.model import MigGeometry, MigGroup, MigInstance
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.plugin.devices import Layout
from deviceplugin.plugin.nodestate import vgpu_register
from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import Obj, StartExtender, create_pod, eventually, gpu_pod

H100 = GpuInfo(0, "GPU-4a3c1b6e-0d5f-4e0a-9c1d-h100mig00000", "NVIDIA H100 80GB HBM3", 81559)
A10 = GpuInfo(1, "GPU-7e2d0c4f-a10a-4b1b-8e3e-a10hamicore0", "NVIDIA A10", 23028)
DEVICE_KEYS = (k.DEVICES_TO_ALLOCATE, k.VGPU_IDS_NEW)
BOTH: list[Compat] = [None, "volcano"]


def daemon_node(name: str, gpus: tuple[GpuInfo, ...], mode: str) -> Obj:
    """A vGPU node as the daemon publishes it: `node-vgpu-register` from the daemon's own writer
    (every card with the node's mode) and the three allocatable vGPU resources."""
    layout = Layout()
    register = vgpu_register(gpus, {gpu.uuid: True for gpu in gpus}, layout, mode)
    resources = {
        k.VGPU_NUMBER: str(len(gpus) * layout.split_count),
        k.VGPU_MEMORY: str(sum(layout.vgpu_memory_units(gpu) for gpu in gpus)),
        k.VGPU_CORES: str(len(gpus) * 100),
    }
    return {
        "metadata": {"name": name, "annotations": {k.NODE_VGPU_REGISTER: register}},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def vgpu_pod(name: str, memory: int, annotations: dict[str, str] | None = None) -> Obj:
    return gpu_pod(name, {k.VGPU_NUMBER: "1", k.VGPU_MEMORY: str(memory)}, annotations=annotations)


def library_devices(
    node: Obj, pod: Obj, compat: Compat, geometries: tuple[MigGeometry, ...]
) -> dict[str, str]:
    """The fit library's bind annotations for the pod on the node as it stands, devices only."""
    config = VgpuConfig(mig_geometries=geometries)
    gpus = vgpu_gpus(node, config=config, compat=compat)
    result = fit_vgpu(gpus, parse_vgpu_requests(pod, config, compat), pod, "binpack", compat, config=config)
    assert result.ok, result.reason
    notes = vgpu_bind_annotations(result, "n1", 0, compat)
    return {key: notes[key] for key in DEVICE_KEYS}


def bound_devices(apiserver: ApiServerEmulator, name: str) -> dict[str, str]:
    stored = apiserver.get("pods", name, "default")
    assert stored is not None and stored["spec"].get("nodeName") == "n1"
    notes = stored["metadata"]["annotations"]
    return {key: notes[key] for key in DEVICE_KEYS}


@pytest.mark.parametrize("compat", BOTH)
def test_a_mig_node_gets_pods_bound_to_slots_exactly_as_the_fit_library_places_them(
    apiserver: ApiServerEmulator, start_extender: StartExtender, compat: Compat
) -> None:
    node = daemon_node("n1", (H100,), k.MODE_MIG)
    assert node["metadata"]["annotations"][k.NODE_VGPU_REGISTER].endswith(
        "NVIDIA-NVIDIA H100 80GB HBM3,true,mig:"
    )
    apiserver.create("nodes", node)
    ext = start_extender(strategy="vgpu", compat=compat)
    first = create_pod(apiserver, vgpu_pod("first", 20000))

    assert ext.client.filter(first, ["n1"])["NodeNames"] == ["n1"]
    expected = library_devices(node, first, compat, builtin_geometries())
    assert ext.client.bind(first, "n1") == ""

    # the smallest instance of 20000 MiB or more of the first group that has one: 2g.20gb of group2
    assert expected[k.DEVICES_TO_ALLOCATE] == f"{H100.uuid}[group2-0],NVIDIA,20000,0:"
    assert bound_devices(apiserver, "first") == expected
    # the slot is booked: the next pod takes the group's next 2g.20gb slot
    second = create_pod(apiserver, vgpu_pod("second", 20000))
    assert ext.client.bind(second, "n1") == ""
    assert (
        bound_devices(apiserver, "second")[k.DEVICES_TO_ALLOCATE] == f"{H100.uuid}[group2-1],NVIDIA,20000,0:"
    )


def test_the_device_configs_geometries_number_the_slots(
    apiserver: ApiServerEmulator, start_extender: StartExtender, tmp_path: Path
) -> None:
    halves = MigGeometry(("H100 80GB HBM3",), (MigGroup("halves", (MigInstance("3g.40gb", 40448, 2),)),))
    path = tmp_path / "device-config.yaml"
    shape = {
        "models": list(halves.models),
        "allowedGeometries": [
            {"group": "halves", "geometries": [{"name": "3g.40gb", "memory": 40448, "count": 2}]}
        ],
    }
    path.write_text(yaml.safe_dump({"nvidia": {"knownMigGeometries": [shape]}}))
    config = load_config({"device-config": str(path)}, env={})
    assert config.mig_geometries == (halves,)
    node = daemon_node("n1", (H100,), k.MODE_MIG)
    apiserver.create("nodes", node)
    ext = start_extender(strategy="vgpu", mig_geometries=config.mig_geometries)
    pod = create_pod(apiserver, vgpu_pod("small", 1000))

    assert ext.client.bind(pod, "n1") == ""

    assert bound_devices(apiserver, "small") == library_devices(node, pod, None, (halves,))
    assert bound_devices(apiserver, "small")[k.DEVICES_TO_ALLOCATE] == f"{H100.uuid}[halves-0],NVIDIA,1000,0:"


def test_a_mig_card_no_geometry_names_is_refused_with_the_reason(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", daemon_node("n1", (A10,), k.MODE_MIG))
    ext = start_extender(strategy="vgpu")
    pod = create_pod(apiserver, vgpu_pod("p", 1000))

    failed = ext.client.filter(pod, ["n1"])["FailedNodes"]

    assert "MIG card with no configured geometry for type 'NVIDIA-NVIDIA A10'" in failed["n1"]


@pytest.mark.parametrize("compat", BOTH)
def test_a_pod_asking_mig_goes_to_the_mig_node_and_one_asking_hami_core_to_the_other(
    apiserver: ApiServerEmulator, start_extender: StartExtender, compat: Compat
) -> None:
    apiserver.create("nodes", daemon_node("mig", (H100,), k.MODE_MIG))
    apiserver.create("nodes", daemon_node("shared", (A10,), k.MODE_HAMI_CORE))
    ext = start_extender(strategy="vgpu", compat=compat)
    eventually(lambda: ext.sees_node("mig") and ext.sees_node("shared"))

    wants_mig = create_pod(apiserver, vgpu_pod("m", 1000, {k.VGPU_MODE: k.MODE_MIG}))
    wants_hami = create_pod(apiserver, vgpu_pod("h", 1000, {k.VGPU_MODE: k.MODE_HAMI_CORE}))
    either = create_pod(apiserver, vgpu_pod("e", 1000))

    assert ext.client.filter(wants_mig, ["mig", "shared"])["NodeNames"] == ["mig"]
    assert ext.client.filter(wants_hami, ["mig", "shared"])["NodeNames"] == ["shared"]
    assert ext.client.filter(either, ["mig", "shared"])["NodeNames"] == ["mig", "shared"]


def test_geometries_default_to_the_daemons_and_a_malformed_key_is_named(tmp_path: Path) -> None:
    assert load_config({}, env={}).mig_geometries == BUILTIN_MIG_GEOMETRIES == builtin_geometries()
    path = tmp_path / "device-config.yaml"
    path.write_text("nvidia:\n  deviceSplitCount: 10\n")
    assert load_config({"device-config": str(path)}, env={}).mig_geometries == builtin_geometries()
    path.write_text(yaml.safe_dump({"nvidia": {"knownMigGeometries": known_mig_geometries()}}))
    assert load_config({"device-config": str(path)}, env={}).mig_geometries == builtin_geometries()

    path.write_text(
        "nvidia:\n  knownMigGeometries:\n    - models: [A30]\n      allowedGeometries:\n"
        "        - group: g\n          geometries: [{name: 1g.6gb, memory: 0, count: 4}]\n"
    )
    with pytest.raises(ExtenderConfigError, match=r"--device-config .*knownMigGeometries\[0\]"):
        load_config({"device-config": str(path)}, env={})
    # Volcano's scheduler falls back to its defaults when the ConfigMap does not load
    volcano = load_config({"device-config": str(path), "compat": "volcano"}, env={})
    assert volcano.mig_geometries == builtin_geometries()
