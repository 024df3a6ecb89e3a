"""Ascend 310P vNPUs in `deviceplugin simulate`: the demo's Ascend node carries what HAMi's Ascend
device plugin writes, and a template pod and a hami-core pod are bound through the extender with
HAMi's annotations, shown in the text and JSON outputs; the check of those annotations catches a
wrong one."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from kubesim.ascend import AscendNodeSpec, verify_ascend
from tests.sim.simulate_run import simulate, simulate_json

NODE = AscendNodeSpec("npu-ascend-1")
CARD0, CARD1 = NODE.ids


def test_the_ascend_node_is_registered_as_hamis_plugin_writes_it() -> None:
    assert NODE.registration() == (
        f'[{{"id":"{CARD0}","count":7,"devmem":21527,"devcore":100,"type":"Ascend310P","health":true}},'
        f'{{"id":"{CARD1}","index":1,"count":7,"devmem":21527,"devcore":100,"type":"Ascend310P","health":true}}]'
    )
    template_node = AscendNodeSpec("npu-t", cards=1, hami_core=False)
    assert '"devcore":8' in template_node.registration()
    assert template_node.node({})["metadata"]["annotations"]["hami-vnpu-core"] == "false"
    assert template_node.status()["allocatable"] == {"huawei.com/Ascend310P": "7"}


def test_the_demo_binds_a_template_and_a_hami_core_pod_with_hamis_annotations(tmp_path: Path) -> None:
    run = simulate_json(None, tmp_path)
    assert run.code == 0, run.stdout + run.stderr
    node = run.node("npu-ascend-1")
    assert (node["strategy"], node["mode"]) == ("ascend", "hami-core")
    assert node["annotations"]["hami.io/node-register-Ascend310P"] == NODE.registration()
    assert node["allocatable"] == {"huawei.com/Ascend310P": "14"}
    template, hami_core = run.pod("npu-template", "demo"), run.pod("npu-hami-core", "demo")
    for pod in (template, hami_core):
        assert (pod["node"], pod["problem"]) == ("npu-ascend-1", None)
        notes = pod["annotations"]
        assert (notes["hami.io/vgpu-node"], notes["hami.io/bind-phase"]) == ("npu-ascend-1", "allocating")
        assert notes["predicate-time"] == notes["hami.io/bind-time"] == notes["hami.io/vgpu-time"]
    # 4096 MiB rounds up to vir02's 6144; binpack puts the hami-core pod on the card already in use.
    notes = template["annotations"]
    assert notes["hami.io/Ascend310P-devices-allocated"] == f"{CARD0},Ascend310P,6144,0:;"
    assert notes["hami.io/Ascend310P-devices-to-allocate"] == f"{CARD0},Ascend310P,6144,0:;"
    assert notes["huawei.com/Ascend310P"] == f'[{{"UUID":"{CARD0}","temp":"vir02"}}]'
    notes = hami_core["annotations"]
    assert notes["hami.io/Ascend310P-devices-allocated"] == f"{CARD0},Ascend310P,8192,50:;"
    assert notes["huawei.com/Ascend310P"] == f'[{{"UUID":"{CARD0}","memory":8192,"core":50}}]'


def test_the_demo_text_shows_the_ascend_node_and_each_pods_bind_annotations() -> None:
    done = simulate()
    assert done.code == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"^npu-ascend-1 +ascend +hami-core +2x21527 Ascend310P", out, flags=re.M), out
    assert f"npu-ascend-1: hami.io/node-register-Ascend310P={NODE.registration()}" in out
    assert "npu-ascend-1: allocatable huawei.com/Ascend310P=14" in out
    block = out.split("demo/npu-template bound to npu-ascend-1 with:\n", 1)[1]
    assert f"  hami.io/Ascend310P-devices-allocated: {CARD0},Ascend310P,6144,0:;\n" in block
    assert f'  huawei.com/Ascend310P: [{{"UUID":"{CARD0}","temp":"vir02"}}]\n' in block
    block = block.split("demo/npu-hami-core bound to npu-ascend-1 with:\n", 1)[1]
    assert f'  huawei.com/Ascend310P: [{{"UUID":"{CARD0}","memory":8192,"core":50}}]\n' in block
    assert "  huawei.com/vnpu-mode: hami-core\n" in block


def _bound(
    limits: dict[str, str], notes: dict[str, str], pod_notes: dict[str, str] | None = None
) -> dict[str, Any]:
    container = {"name": "npu", "resources": {"limits": limits}}
    annotations = {"hami.io/vgpu-node": NODE.name, "hami.io/bind-phase": "allocating", **(pod_notes or {})}
    return {
        "metadata": {"name": "p", "namespace": "demo", "annotations": annotations | notes},
        "spec": {"containers": [container]},
    }


def test_the_check_catches_a_wrong_template_booking_or_card() -> None:
    limits = {"huawei.com/Ascend310P": "1", "huawei.com/Ascend310P-memory": "4096"}
    right = f"{CARD0},Ascend310P,6144,0:;"
    runtime = json.dumps([{"UUID": CARD0, "temp": "vir02"}], separators=(",", ":"))
    good = {
        "hami.io/Ascend310P-devices-allocated": right,
        "hami.io/Ascend310P-devices-to-allocate": right,
        "huawei.com/Ascend310P": runtime,
    }
    assert verify_ascend(_bound(limits, good), NODE) == []
    booked = {
        **good,
        "hami.io/Ascend310P-devices-allocated": right.replace("6144", "4096"),
        "hami.io/Ascend310P-devices-to-allocate": right.replace("6144", "4096"),
    }
    assert "booked 4096 MiB, the rules give 6144" in " ".join(verify_ascend(_bound(limits, booked), NODE))
    wrong_temp = {**good, "huawei.com/Ascend310P": runtime.replace("vir02", "vir01")}
    assert "should be" in " ".join(verify_ascend(_bound(limits, wrong_temp), NODE))
    elsewhere = {k: v.replace(CARD0, "NPU-other") for k, v in good.items()}
    assert "is not registered on npu-ascend-1" in " ".join(verify_ascend(_bound(limits, elsewhere), NODE))
