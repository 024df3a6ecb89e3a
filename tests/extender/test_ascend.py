"""Ascend 310P vNPU pods through the extender over HTTP: filter, prioritize and bind against the
API-server emulator, the bind annotations byte for byte Volcano's (the golden cases of
tests/fit/test_ascend.py), in both modes; Ascend beside a GPU strategy on one node and in one pod."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.extender import ExtenderConfigError, load_config
from deviceplugin.fit.ascend_config import ASCEND310P, DEFAULT_VNPUS
from deviceplugin.fit.families import AscendFamily, family_of
from deviceplugin.fit.model import DEFAULT_VGPU_CONFIG, Compat
from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import (
    Obj,
    StartExtender,
    create_pod,
    eventually,
    gpu_pod,
    share_node,
    vgpu_node,
)
from tests.fit.ascend_builders import ALLOCATED, CORE, COUNT, MEMORY, MODE, REGISTER, registration

BOTH: tuple[Compat, ...] = (None, "volcano")
ASCEND_KEYS = {
    "hami.io/Ascend310P-devices-to-allocate",
    "hami.io/Ascend310P-devices-allocated",
    "huawei.com/Ascend310P",
    "predicate-time",
    "hami.io/vgpu-node",
    "hami.io/vgpu-time",
    "hami.io/bind-phase",
    "hami.io/bind-time",
}
_TIMES = ("predicate-time", "hami.io/vgpu-time", "hami.io/bind-time")


def _serving(compat: Compat) -> dict[str, Any]:
    """The extender's options serving Ascend in `compat`: Volcano's must turn it on, as Volcano's
    deviceshare.AscendHAMiVNPUEnable; the default mode serves it untold."""
    return {"compat": compat, "ascend_hami_vnpu": True} if compat == "volcano" else {"compat": compat}


def npu_node(name: str, *ids: str, annotations: dict[str, str] | None = None, base: Obj | None = None) -> Obj:
    """A node as the HAMi Ascend device plugin leaves it: 7 vNPU slots per chip in allocatable and
    the registration annotation (on top of `base`, a GPU node, when given)."""
    node: Obj = base or {"metadata": {"name": name}, "status": {"capacity": {}, "allocatable": {}}}
    notes = node["metadata"].setdefault("annotations", {})
    notes.update({REGISTER: registration(*ids), **(annotations or {})})
    for section in ("capacity", "allocatable"):
        node["status"][section][COUNT] = str(7 * len(ids))
    return node


def npu_pod(name: str, *limits: dict[str, str], annotations: dict[str, str] | None = None, **kw: Any) -> Obj:
    pod = gpu_pod(name, limits[0], annotations=annotations, **kw)
    for index, more in enumerate(limits[1:], start=1):
        pod["spec"]["containers"].append(
            {"name": f"c{index}", "image": "npu", "resources": {"limits": dict(more)}}
        )
    return pod


def _held(apiserver: ApiServerEmulator, node: str, value: str) -> None:
    """A running pod the device plugin placed: Volcano's ledger annotation."""
    create_pod(
        apiserver,
        npu_pod("held", {COUNT: "1"}, node=node, annotations={ALLOCATED: value}, phase="Running"),
    )


def _stored(apiserver: ApiServerEmulator, name: str) -> dict[str, str]:
    pod = apiserver.get("pods", name, "default")
    assert pod is not None
    notes: dict[str, str] = pod["metadata"].get("annotations") or {}
    return notes


def _without_times(notes: dict[str, str], node: str, before_s: int) -> dict[str, str]:
    """The annotations with the three Unix times checked (one decision time, in seconds) and cut."""
    times = {notes[key] for key in _TIMES}
    assert len(times) == 1
    assert before_s <= int(times.pop()) <= time.time()
    assert notes["hami.io/vgpu-node"] == node
    return {key: value for key, value in notes.items() if key not in _TIMES}


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(("policy", "uuid", "score"), [("binpack", "NPU-A", 6), ("spread", "NPU-B", 10)])
def test_a_template_pod_is_scheduled_and_bound_exactly_as_volcano(
    apiserver: ApiServerEmulator,
    start_extender: StartExtender,
    compat: Compat,
    policy: str,
    uuid: str,
    score: int,
) -> None:
    # The golden case: NPU-A holds a vir04; the pod asks 1 card and 4096 MiB (trimmed to vir02).
    # Binpack: A scores 100 x 12288/21527 = 57.08 (host score floor(5.708 + 0.5) = 6); spread: idle B, 100.
    apiserver.create("nodes", npu_node("node-a", "NPU-A", "NPU-B"))
    apiserver.create("nodes", share_node("gpu-only"))
    _held(apiserver, "node-a", "NPU-A,Ascend310P,12288,0:;")
    ext = start_extender(strategy="share", policy=policy, **_serving(compat))
    pod = create_pod(apiserver, npu_pod("new", {COUNT: "1", MEMORY: "4096"}, annotations={"team": "a"}))
    eventually(lambda: ext.extender.pods.get(pod["metadata"]["uid"]) is not None)

    result = ext.client.filter(pod, ["node-a", "gpu-only"])
    if compat == "volcano":  # Volcano's predicate skips a device type the node lacks
        assert result["NodeNames"] == ["node-a", "gpu-only"]
    else:
        assert result["NodeNames"] == ["node-a"]
        assert "gpu-only has no Ascend310P cards" in result["FailedAndUnresolvableNodes"]["gpu-only"]
    assert ext.client.prioritize(pod, ["node-a"]) == {"node-a": score}
    before = int(time.time())
    assert ext.client.bind(pod, "node-a") == ""

    notes = _stored(apiserver, "new")
    assert set(notes) == ASCEND_KEYS | {"team"}
    assert _without_times(notes, "node-a", before) == {
        "team": "a",
        "hami.io/Ascend310P-devices-to-allocate": f"{uuid},Ascend310P,6144,0:;",
        "hami.io/Ascend310P-devices-allocated": f"{uuid},Ascend310P,6144,0:;",
        "huawei.com/Ascend310P": f'[{{"UUID":"{uuid}","temp":"vir02"}}]',
        "hami.io/vgpu-node": "node-a",
        "hami.io/bind-phase": "allocating",
    }


@pytest.mark.parametrize("compat", BOTH)
def test_a_hami_core_pod_binds_its_memory_and_cores_on_a_hami_core_node_only(
    apiserver: ApiServerEmulator, start_extender: StartExtender, compat: Compat
) -> None:
    apiserver.create("nodes", npu_node("soft", "NPU-S", annotations={"hami-vnpu-core": "true"}))
    apiserver.create("nodes", npu_node("templates", "NPU-T"))
    ext = start_extender(strategy="vgpu", **_serving(compat))
    pod = create_pod(apiserver, npu_pod("new", {COUNT: "1", MEMORY: "4096", CORE: "90"}, annotations=MODE))
    eventually(lambda: ext.extender.pods.get(pod["metadata"]["uid"]) is not None)

    result = ext.client.filter(pod, ["soft", "templates"])
    assert result["NodeNames"] == ["soft"]
    assert "Ascend310P" in result["FailedNodes"]["templates"]
    assert ext.client.bind(pod, "soft") == ""
    notes = _stored(apiserver, "new")
    assert notes["hami.io/Ascend310P-devices-to-allocate"] == "NPU-S,Ascend310P,4096,90:;"  # not trimmed
    assert notes["huawei.com/Ascend310P"] == '[{"UUID":"NPU-S","memory":4096,"core":90}]'


@pytest.mark.parametrize("compat", BOTH)
def test_binds_book_the_cards_so_the_next_pod_goes_elsewhere(
    apiserver: ApiServerEmulator, start_extender: StartExtender, compat: Compat
) -> None:
    # Two containers, each a whole card, on a two-card node: the second such pod finds no card
    # (the first was booked at bind, before any watch event shows it).
    apiserver.create("nodes", npu_node("node-a", "NPU-A", "NPU-B"))
    ext = start_extender(**_serving(compat))
    first, second = (
        create_pod(apiserver, npu_pod(name, {COUNT: "1", MEMORY: "20000"}, {COUNT: "1", MEMORY: "20000"}))
        for name in ("first", "second")
    )
    eventually(lambda: ext.extender.pods.get(second["metadata"]["uid"]) is not None)
    assert ext.client.bind(first, "node-a") == ""
    value = _stored(apiserver, "first")["hami.io/Ascend310P-devices-allocated"]
    assert sorted(value.split(";")) == sorted(["", "NPU-A,Ascend310P,21527,0:", "NPU-B,Ascend310P,21527,0:"])
    assert "node-a" in ext.client.filter(second, ["node-a"])["FailedNodes"]
    assert "cards it needs" in ext.client.bind(second, "node-a")


def test_a_malformed_registration_refuses_the_node_with_the_reason(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    broken = npu_node("broken", "NPU-X")
    broken["metadata"]["annotations"][REGISTER] = '[{"id":"NPU-X","count":"seven"}]'
    apiserver.create("nodes", broken)
    ext = start_extender()
    pod = create_pod(apiserver, npu_pod("new", {COUNT: "1"}))
    reason = ext.client.filter(pod, ["broken"])["FailedAndUnresolvableNodes"]["broken"]
    assert reason.startswith("node broken: ") and REGISTER in reason and "count" in reason
    assert "broken" in ext.client.bind(pod, "broken")


@pytest.mark.parametrize("compat", BOTH)
def test_a_failed_binding_call_writes_no_ascend_key_and_gives_the_card_back(
    apiserver: ApiServerEmulator, start_extender: StartExtender, compat: Compat
) -> None:
    apiserver.create("nodes", npu_node("node-a", "NPU-A"))
    ext = start_extender(**_serving(compat))
    pod = create_pod(apiserver, npu_pod("new", {COUNT: "1", MEMORY: "20000"}))
    eventually(lambda: ext.extender.pods.get(pod["metadata"]["uid"]) is not None)
    apiserver.faults.error(500, path="/binding", times=1)
    assert "failed" in ext.client.bind(pod, "node-a")
    assert not set(_stored(apiserver, "new")) & ASCEND_KEYS
    view = ext.extender.inventory.view("node-a")
    assert view is not None and view.npus[0] is not None
    assert [card.used_num for card in view.npus[0].cards] == [0]  # the whole card is free again
    assert ext.client.bind(pod, "node-a") == ""


@pytest.mark.parametrize("compat", BOTH)
def test_a_node_runs_a_gpu_strategy_and_ascend_side_by_side(
    apiserver: ApiServerEmulator, start_extender: StartExtender, compat: Compat
) -> None:
    base = vgpu_node("mixed", gpus=1)
    base["metadata"]["labels"] = {"volcano.sh/gpu-strategy": "vgpu"}
    apiserver.create("nodes", npu_node("mixed", "NPU-A", base=base))
    ext = start_extender(strategy="vgpu", **_serving(compat))
    gpu = create_pod(
        apiserver, gpu_pod("gpu", {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1000"})
    )
    npu = create_pod(apiserver, npu_pod("npu", {COUNT: "1", MEMORY: "3000"}))
    eventually(lambda: ext.extender.pods.get(npu["metadata"]["uid"]) is not None)
    assert ext.client.filter(npu, ["mixed"])["NodeNames"] == ["mixed"]
    assert ext.client.bind(gpu, "mixed") == "" and ext.client.bind(npu, "mixed") == ""
    gpu_notes, npu_notes = _stored(apiserver, "gpu"), _stored(apiserver, "npu")
    assert "volcano.sh/devices-to-allocate" in gpu_notes and not set(gpu_notes) & ASCEND_KEYS
    assert set(npu_notes) == ASCEND_KEYS
    assert npu_notes["huawei.com/Ascend310P"] == '[{"UUID":"NPU-A","temp":"vir01"}]'


def test_an_ascend_pod_is_not_refused_on_a_node_labelled_with_another_strategy(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    base = share_node("shared")
    base["metadata"]["labels"] = {"volcano.sh/gpu-strategy": "share"}
    apiserver.create("nodes", npu_node("shared", "NPU-A", base=base))
    ext = start_extender(strategy="vgpu")
    pod = create_pod(apiserver, npu_pod("npu", {COUNT: "1"}))
    gpu = create_pod(apiserver, gpu_pod("gpu", {"volcano.sh/vgpu-number": "1"}))
    assert ext.client.filter(pod, ["shared"])["NodeNames"] == ["shared"]
    assert (
        "runs the share GPU strategy"
        in ext.client.filter(gpu, ["shared"])["FailedAndUnresolvableNodes"]["shared"]
    )


@pytest.mark.parametrize("compat", BOTH)
def test_a_pod_asking_a_vgpu_and_a_vnpu_gets_both_and_one_summed_score(
    apiserver: ApiServerEmulator, start_extender: StartExtender, compat: Compat
) -> None:
    base = vgpu_node("mixed", gpus=1)
    apiserver.create("nodes", npu_node("mixed", "NPU-A", "NPU-B", base=base))
    _held(apiserver, "mixed", "NPU-A,Ascend310P,12288,0:;")
    ext = start_extender(strategy="vgpu", **_serving(compat))
    both = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1000", COUNT: "1", MEMORY: "4096"}
    pod = create_pod(apiserver, npu_pod("both", both))
    eventually(lambda: ext.extender.pods.get(pod["metadata"]["uid"]) is not None)

    # Volcano sums the device types' raw scores, then rounds once: vGPU 6.25 + Ascend 57.08 on
    # the extender's 0..10 scale is 6.33 -> 6 (rounding each first would give 1 + 6 = 7).
    view = ext.extender.inventory.view("mixed")
    assert view is not None
    vgpu = family_of("vgpu")
    gpu_fit = vgpu.fit(
        view.gpus, pod, vgpu.request(pod, compat), policy="binpack", compat=compat, config=DEFAULT_VGPU_CONFIG
    )
    assert gpu_fit.score == 6.25
    assert (
        ext.client.prioritize(pod, ["mixed"])
        == {"mixed": math.floor((6.25 + 100 * 12288 / 21527) / 10 + 0.5)}
        == {"mixed": 6}
    )

    assert ext.client.bind(pod, "mixed") == ""
    notes = _stored(apiserver, "both")
    assert set(notes) >= ASCEND_KEYS
    assert {"volcano.sh/devices-to-allocate", "volcano.sh/vgpu-ids-new", "volcano.sh/bind-phase"} <= set(
        notes
    )
    assert notes["hami.io/Ascend310P-devices-to-allocate"] == "NPU-A,Ascend310P,6144,0:;"
    assert notes["volcano.sh/vgpu-node"] == notes["hami.io/vgpu-node"] == "mixed"


def test_the_first_family_that_does_not_fit_gives_the_reason(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", npu_node("mixed", "NPU-A", base=vgpu_node("mixed", gpus=1)))
    ext = start_extender(strategy="vgpu")
    too_much_gpu = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "99999", COUNT: "1"}
    too_many_npus = {"volcano.sh/vgpu-number": "1", COUNT: "2"}
    gpu_short = create_pod(apiserver, npu_pod("g", too_much_gpu))
    npu_short = create_pod(apiserver, npu_pod("n", too_many_npus))
    gpu_reason = ext.client.filter(gpu_short, ["mixed"])["FailedNodes"]["mixed"]
    npu_reason = ext.client.filter(npu_short, ["mixed"])["FailedNodes"]["mixed"]
    assert "Ascend310P" not in gpu_reason
    assert npu_reason.startswith("Ascend310P: container 'main': 1 of the 2 Ascend310P cards it needs")


def test_a_pod_asking_ascend_is_no_mix_of_gpu_strategies(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", npu_node("node-a", "NPU-A", base=share_node("node-a")))
    ext = start_extender(strategy="share")
    pod = create_pod(apiserver, npu_pod("p", {"volcano.sh/gpu-memory": "1000", COUNT: "1"}))
    result = ext.client.filter(pod, ["node-a"])
    assert result["Error"] == "" and result["NodeNames"] == ["node-a"]


def test_an_ascend_request_that_cannot_be_served_is_an_error_by_default(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    apiserver.create("nodes", npu_node("node-a", "NPU-A"))
    ext = start_extender()
    pod = create_pod(apiserver, npu_pod("p", {COUNT: "1", MEMORY: "30000"}))
    assert "above the 24576 MiB" in ext.client.filter(pod, ["node-a"])["Error"]
    volcano = start_extender(**_serving("volcano"))
    # Volcano books it as 0 MiB and binds it as vir01
    assert volcano.client.bind(pod, "node-a") == ""
    assert _stored(apiserver, "p")["huawei.com/Ascend310P"] == '[{"UUID":"NPU-A","temp":"vir01"}]'


@pytest.mark.parametrize("compat", BOTH)
def test_a_card_registering_more_than_the_chips_capacity(
    apiserver: ApiServerEmulator, start_extender: StartExtender, compat: Compat
) -> None:
    # HAMi's device plugin registers its configured memoryAllocatable: 30000 MiB is another chip's
    # configuration. Volcano books the whole card as 0 MiB and binds it as vir01; the default refuses
    # the node, naming the card, its memory and the capacity.
    big = registration("BIG-A").replace('"devmem":21527', '"devmem":30000')
    apiserver.create("nodes", npu_node("node-a", "BIG-A", annotations={REGISTER: big}))
    ext = start_extender(**_serving(compat))
    pod = create_pod(apiserver, npu_pod("p", {COUNT: "1"}))
    result = ext.client.filter(pod, ["node-a"])
    if compat is None:
        assert result["NodeNames"] == []
        reason = result["FailedNodes"]["node-a"]
        assert "card BIG-A registers 30000 MiB, above the 24576 MiB memoryCapacity of Ascend310P" in reason
        return
    assert result["NodeNames"] == ["node-a"]
    assert ext.client.bind(pod, "node-a") == ""
    notes = _stored(apiserver, "p")
    assert notes[ALLOCATED] == "BIG-A,Ascend310P,0,0:;"
    assert notes["huawei.com/Ascend310P"] == '[{"UUID":"BIG-A","temp":"vir01"}]'


# --- configuration -------------------------------------------------------------------------------


def test_the_documented_scheduler_configuration_leaves_vnpu_memory_and_cores_to_the_extender() -> None:
    # Otherwise kube-scheduler finds every node short of them: no node advertises them.
    text = (Path(__file__).parents[2] / "docs" / "extender.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    (entry,) = yaml.safe_load(block)["extenders"]
    managed = {item["name"]: item.get("ignoredByScheduler", False) for item in entry["managedResources"]}
    family = AscendFamily(ASCEND310P)
    assert managed[COUNT] is False
    assert {name: managed.get(name) for name in family.ignored_resources} == {MEMORY: True, CORE: True}


def test_the_device_config_file_names_the_chips(tmp_path: Any) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text("vnpus:\n  hamiVnpuCore: true\n  configs: []\nnvidia: {}\n")
    config = load_config({"device-config": str(path)}, env={})
    assert config.vnpus.chips == () and config.vnpus.hami_vnpu_core
    assert load_config({}, env={}).vnpus == DEFAULT_VNPUS
    assert DEFAULT_VNPUS.chips == (ASCEND310P,)


def test_a_malformed_vnpus_section_is_an_error_naming_it_or_volcanos_default(tmp_path: Any) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text("vnpus:\n  configs:\n    - commonWord: 7\n")
    with pytest.raises(ExtenderConfigError, match=r"--device-config .*vnpus\.configs\[0\]"):
        load_config({"device-config": str(path)}, env={})
    assert load_config({"device-config": str(path), "compat": "volcano"}, env={}).vnpus == DEFAULT_VNPUS


# --- the AscendHAMiVNPUEnable switch ------------------------------------------------------------


def test_the_ascend_switch_reads_volcanos_key_and_defaults_as_each_mode(tmp_path: Path) -> None:
    path = tmp_path / "extender.yaml"
    path.write_text("deviceshare.AscendHAMiVNPUEnable: false\n")
    assert load_config({"config": str(path)}, env={}).serves_ascend is False
    path.write_text("compat: volcano\ndeviceshare.AscendHAMiVNPUEnable: true\n")
    assert load_config({"config": str(path)}, env={}).serves_ascend is True
    assert load_config({}, env={}).serves_ascend is True  # the default mode serves the chips untold
    assert load_config({"compat": "volcano"}, env={}).serves_ascend is False  # Volcano's default: off
    path.write_text("ascend-hami-vnpu: true\ndeviceshare.AscendHAMiVNPUEnable: false\n")
    with pytest.raises(ExtenderConfigError, match="given both as ascend-hami-vnpu and as deviceshare"):
        load_config({"config": str(path)}, env={})
    with pytest.raises(ExtenderConfigError, match="--ascend-hami-vnpu"):
        load_config({"ascend-hami-vnpu": "yes"}, env={})


@pytest.mark.parametrize("options", [{"compat": "volcano"}, {"ascend_hami_vnpu": False}])
def test_an_ascend_pod_is_not_served_with_the_switch_off_and_the_filter_says_why(
    apiserver: ApiServerEmulator, start_extender: StartExtender, options: dict[str, Any]
) -> None:
    apiserver.create("nodes", npu_node("node-a", "NPU-A"))
    apiserver.create("nodes", share_node("node-b"))
    ext = start_extender(**options)
    # The documented kube-scheduler configuration leaves -memory to the extender: only it can refuse.
    pod = create_pod(apiserver, npu_pod("p", {COUNT: "1", MEMORY: "4096"}))
    result = ext.client.filter(pod, ["node-a", "node-b"])
    assert result["NodeNames"] == [] and result["Error"] == ""
    why = (
        "Ascend vNPUs are not served: the extender runs with ascend-hami-vnpu "
        "(deviceshare.AscendHAMiVNPUEnable) false"
    )
    assert result["FailedAndUnresolvableNodes"] == {"node-a": why, "node-b": why}
    assert ext.extender.inventory.ascend == ()  # no chip is kept or booked
    # a GPU pod is served as before
    gpu = create_pod(apiserver, gpu_pod("g", {"volcano.sh/gpu-memory": "1000"}))
    assert ext.client.filter(gpu, ["node-b"])["NodeNames"] == ["node-b"]
