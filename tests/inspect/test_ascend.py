"""Ascend 310P cards in `inspect`: per node the cards HAMi's Ascend device plugin registered, their
memory and AI cores used and total, and the pods on each card from
`hami.io/Ascend310P-devices-allocated`, in the text and JSON outputs; a malformed registration is a
note on the node."""

from __future__ import annotations

import json
import re

from kubesim.apiserver import ApiServerEmulator
from tests.inspect.cluster import add_pod, ascend_node, load_ascend, load_share, npu_pod
from tests.inspect.conftest import Inspect
from tests.inspect.table import read_table


def _npu_table(text: str) -> list[dict[str, str]]:
    """The rows of the "Ascend vNPUs:" table."""
    block = text.split("Ascend vNPUs:\n", 1)[1]
    lines = [line[2:] for line in block.splitlines()]
    return read_table("\n".join(lines))


def test_text_shows_each_card_its_use_and_the_pods_on_it(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    load_share(apiserver)
    load_ascend(apiserver)
    run = inspect()
    assert run.code == 0, run.err
    rows = [
        tuple(r[key] for key in ("NAME", "CHIP", "CARD", "ID", "MODE", "MEMORY(MiB)", "AICORE", "PODS"))
        + tuple(r[key] for key in ("PENDING", "HEALTH", "ON-CARD"))
        for r in _npu_table(run.out)
    ]
    assert rows == [
        (
            "npu-1",
            "Ascend310P",
            "0",
            "NPU-A",
            "template",
            "9216/21527",
            "0/8",
            "2/7",
            "1",
            "ok",
            "ml/npu-a,ml/npu-b",
        ),
        ("npu-1", "Ascend310P", "1", "NPU-B", "template", "0/21527", "0/8", "0/7", "0", "ok", "-"),
    ]
    # The GPU table keeps the GPU nodes only; the pending Ascend pod is listed with its card.
    assert {row["NAME"] for row in read_table(run.out)} == {"gpu-share-1"}
    pending = run.out.split("Pending (scheduled, not yet served by the device plugin):\n", 1)[1]
    assert re.search(r"^  npu-1 +ml/npu-b +Ascend310P 0$", pending, re.MULTILINE)
    assert "Allocated/Total Ascend vNPU Memory In Cluster: 9216/43054 MiB (21%)" in run.out
    assert "Allocated/Total Ascend Cards In Cluster: 1/2 (50%)" in run.out


def test_details_list_each_pods_memory_and_cores_per_card(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    load_ascend(apiserver)
    out = inspect("-d").out
    details = out.split("npu-1 (ascend):\n", 1)[1]
    rows = read_table("\n".join(line[2:] for line in details.splitlines()))
    assert [(r["CARD"], r["POD"], r["MEMORY(MiB)"], r["AICORE"], r["STATE"]) for r in rows] == [
        ("Ascend310P 0 (NPU-A)", "ml/npu-a", "6144", "0", "assigned"),
        ("Ascend310P 0 (NPU-A)", "ml/npu-b", "3072", "0", "pending"),
    ]


def test_json_lists_the_cards_with_their_pods(apiserver: ApiServerEmulator, inspect: Inspect) -> None:
    load_ascend(apiserver)
    apiserver.create(
        "nodes",
        ascend_node(
            "npu-2",
            "10.0.0.15",
            '[{"id":"NPU-C","count":7,"devmem":21527,"devcore":100,"type":"Ascend310P","health":true}]',
            hami_core=True,
        ),
    )
    add_pod(apiserver, npu_pod("core-c", "npu-2", "NPU-C,Ascend310P,4096,30:;", "success"))
    document = json.loads(inspect("-o", "json").out)
    npu1, npu2 = document["nodes"]
    assert (npu1["name"], npu1["strategy"], npu1["gpus"], npu1["problems"]) == ("npu-1", "none", [], [])
    card_a = npu1["npus"][0]
    assert card_a == {
        "chip": "Ascend310P",
        "index": 0,
        "id": "NPU-A",
        "mode": "template",
        "healthy": True,
        "memoryMiB": {"allocated": 9216, "total": 21527},
        "aiCores": {"allocated": 0, "total": 8},
        "podCount": 2,
        "podLimit": 7,
        "pendingCount": 1,
        "pods": [
            {
                "namespace": "ml",
                "name": "npu-a",
                "uid": card_a["pods"][0]["uid"],
                "memoryMiB": 6144,
                "cores": 0,
                "state": "assigned",
            },
            {
                "namespace": "ml",
                "name": "npu-b",
                "uid": card_a["pods"][1]["uid"],
                "memoryMiB": 3072,
                "cores": 0,
                "state": "pending",
            },
        ],
    }
    (card_c,) = npu2["npus"]
    assert (card_c["mode"], card_c["aiCores"], [p["name"] for p in card_c["pods"]]) == (
        "hami-core",
        {"allocated": 30, "total": 100},
        ["core-c"],
    )
    assert document["cluster"]["npus"] == {"allocated": 2, "total": 3, "percent": 66}
    assert document["cluster"]["npuMemoryMiB"] == {"allocated": 13312, "total": 64581, "percent": 20}


def test_a_malformed_registration_is_a_note_on_the_node(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    apiserver.create("nodes", ascend_node("npu-bad", "10.0.0.16", '[{"id":"NPU-A","count":7.5}]'))
    run = inspect()
    assert run.code == 0, run.err
    problems = run.out.split("Problems:\n", 1)[1].splitlines()
    assert problems[0] == (
        "  npu-bad: hami.io/node-register-Ascend310P: node registration chip 0 field 'count' must be an "
        "integer, not '7.5'"
    )
    (node,) = json.loads(inspect("-o", "json").out)["nodes"]
    assert node["npus"] == [] and "field 'count' must be an integer" in node["problems"][0]


def test_a_pod_whose_ledger_does_not_decode_is_a_note_and_books_nothing(
    apiserver: ApiServerEmulator, inspect: Inspect
) -> None:
    load_ascend(apiserver)
    add_pod(apiserver, npu_pod("npu-bad", "npu-1", "NPU-B,Ascend310P,lots,0:;", "success"))
    document = json.loads(inspect("-o", "json").out)
    (node,) = document["nodes"]
    assert node["npus"][1]["memoryMiB"] == {"allocated": 0, "total": 21527}
    assert node["problems"][0].startswith("pod ml/npu-bad: hami.io/Ascend310P-devices-allocated: ")
