"""Sharing modes and MIG slots in `inspect`: each vGPU card's registered mode (text MODE column,
JSON `mode`) and, on a `mig` card, the slots its pods hold, read from their `vgpu-ids-new` by the
daemon's built-in geometries (text `-d` "MIG slots in use", JSON `migSlots`)."""

from __future__ import annotations

import json

from deviceplugin.fit import keys
from kubesim.apiserver import ApiServerEmulator
from tests.inspect.cluster import add_pod, gpu_node, load_share, vgpu_pod
from tests.inspect.conftest import Inspect
from tests.inspect.table import gpu_row

H100 = "GPU-h100-0001"
REGISTER = f"{H100},10,81559,NVIDIA-NVIDIA H100 80GB HBM3,true,mig:"


def load_mig(server: ApiServerEmulator) -> None:
    """gpu-mig-1: one H100 in mig mode; mig-a holds group2-0 (a 2g.20gb), mig-b group2-1."""
    capacity = {keys.VGPU_NUMBER: "10", keys.VGPU_MEMORY: "81559", keys.VGPU_CORES: "100"}
    server.create("nodes", gpu_node("gpu-mig-1", "10.0.0.40", capacity, {keys.NODE_VGPU_REGISTER: REGISTER}))
    add_pod(server, vgpu_pod("mig-a", "gpu-mig-1", f"{H100}[group2-0],NVIDIA,20000,0:", "success", 1))
    add_pod(server, vgpu_pod("mig-b", "gpu-mig-1", f"{H100}[group2-1],NVIDIA,15000,0:", "success", 1))


def test_text_shows_each_cards_mode_and_the_mig_slots_in_use(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    load_share(apiserver)
    load_mig(apiserver)
    run = inspect("-d")
    assert run.code == 0, run.err
    row = gpu_row(run.out, "gpu-mig-1", "0")
    assert (row["MODE"], row["MEMORY(MiB)"], row["PODS"]) == ("mig", "40192/81559", "2/10")
    assert gpu_row(run.out, "gpu-share-1", "0")["MODE"] == "-"  # no sharing mode outside vGPU
    slots = run.out.split("  MIG slots in use:\n", 1)[1].splitlines()[:3]
    assert [line.split() for line in slots] == [
        ["GPU", "SLOT", "POD"],
        ["0", "group2-0", "ml/mig-a"],
        ["0", "group2-1", "ml/mig-b"],
    ]


def test_json_carries_the_mode_and_the_slots_with_their_pods(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    load_mig(apiserver)
    run = inspect("-o", "json")
    assert run.code == 0, run.err
    (node,) = json.loads(run.out)["nodes"]
    (gpu,) = node["gpus"]
    assert gpu["mode"] == "mig"
    assert [(s["group"], s["position"], s["namespace"], s["name"]) for s in gpu["migSlots"]] == [
        ("group2", 0, "ml", "mig-a"),
        ("group2", 1, "ml", "mig-b"),
    ]
    assert all(s["uid"] for s in gpu["migSlots"])
