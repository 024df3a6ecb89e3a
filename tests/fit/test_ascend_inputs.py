"""Malformed Ascend inputs: the vnpus config, the node registration, the ledger annotation and
pod requests. The default names the problem; compat="volcano" reads them as Volcano does."""

from __future__ import annotations

from typing import Any

import pytest

from deviceplugin.fit.ascend_config import ASCEND310P, DEFAULT_VNPUS, VnpuConfigError, vnpus_config
from deviceplugin.fit.ascend_register import NpuInfo, decode_npu_register
from deviceplugin.fit.errors import NodeRegisterError, PodDevicesError, RequestError
from deviceplugin.fit.families.ascend import AscendFamily
from deviceplugin.fit.model import DEFAULT_VGPU_CONFIG
from tests.fit.ascend_builders import ALLOCATED, CORE, COUNT, MEMORY, MODE, card, npu_pod
from tests.fit.builders import container, pod

FAMILY = AscendFamily(ASCEND310P)


def _chip(**changes: Any) -> dict[str, Any]:
    chip: dict[str, Any] = {
        "commonWord": "Ascend310P",
        "resourceName": "huawei.com/Ascend310P",
        "resourceMemoryName": "huawei.com/Ascend310P-memory",
        "memoryAllocatable": 21527,
        "memoryCapacity": 24576,
        "templates": [{"name": "vir01", "memory": 3072}],
    }
    chip.update(changes)
    return chip


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("nope", r"^vnpus: must be a mapping, not str$"),
        ({"configs": {}}, r"^vnpus.configs: must be a list"),
        ({"hamiVnpuCore": "yes"}, r"^vnpus.hamiVnpuCore: must be true or false"),
        ({"hamiVnpuCore": True, "config": []}, r"^vnpus: unknown field 'config'"),
        ([_chip(commonword="x")], r"^vnpus.configs\[0\]: unknown field 'commonword'"),
        ([_chip(commonWord="")], r"commonWord: '' must be non-empty"),
        ([_chip(commonWord="A,B")], r"commonWord: 'A,B' must be non-empty, unpadded and free of"),
        ([_chip(commonWord="a/b")], r"commonWord: 'a/b' must not contain '/'"),
        ([_chip(resourceName=7)], r"resourceName: must be a string, not 7"),
        (
            [_chip(resourceMemoryName="huawei.com/Ascend310P-core")],
            r"resourceMemoryName: .* must name its own",
        ),
        ([_chip(memoryAllocatable="21527")], r"memoryAllocatable: must be a whole number from 1"),
        ([_chip(memoryAllocatable=True)], r"memoryAllocatable: must be a whole number"),
        ([_chip(memoryCapacity=100)], r"memoryCapacity: must be a whole number from 21527"),
        ([_chip(aiCore=-1)], r"aiCore: must be a whole number from 0"),
        (
            [_chip(templates=[{"name": "vir01", "memory": 30000}])],
            r"templates\[0\].memory: .* from 1 to 21527",
        ),
        ([_chip(templates=[{"name": "v", "memory": 1}, {"name": "v", "memory": 2}])], r"given twice"),
        ([_chip(templates=[{"memory": 1}])], r"templates\[0\].name: '' must be non-empty"),
        ([_chip(), _chip(resourceName="huawei.com/other")], r"'Ascend310P' names two chips"),
        ([_chip(), _chip(commonWord="Other")], r"'huawei.com/Ascend310P' names two chips"),
    ],
)
def test_malformed_vnpus_are_named_by_default_and_give_volcano_s_default(
    section: object, message: str
) -> None:
    with pytest.raises(VnpuConfigError, match=message):
        vnpus_config({"vnpus": section})
    lenient = vnpus_config({"vnpus": section}, "volcano")
    assert isinstance(lenient.chips, tuple)  # Volcano reads it or falls back: never an error


def test_volcano_falls_back_to_the_default_only_where_yaml_v2_fails() -> None:
    assert vnpus_config({"vnpus": "nope"}, "volcano") == DEFAULT_VNPUS
    [chip] = vnpus_config({"vnpus": [_chip(commonword="x", memoryCapacity=100)]}, "volcano").chips
    assert chip.memory_capacity == 100  # unknown fields and odd values pass through yaml.v2


def test_no_vnpus_section_configures_no_chip() -> None:
    assert vnpus_config({"nvidia": {}}).chips == ()
    with pytest.raises(VnpuConfigError, match=r"device-config.yaml: must be a mapping"):
        vnpus_config([])


def test_templates_are_sorted_by_memory() -> None:
    section = [_chip(templates=[{"name": "big", "memory": 6144}, {"name": "small", "memory": 3072}])]
    assert [t.name for t in vnpus_config({"vnpus": section}).chips[0].templates] == ["small", "big"]


# --- node registration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not json", r"is not valid JSON"),
        ('{"id":"a"}', r"must be a JSON list of chips"),
        ("[1]", r"chip 0 must be a JSON object"),
        ("[null]", r"chip 0 is null"),
        ('[{"id":"a","count":1.0}]', r"field 'count' must be an integer, not '1.0'"),
        ('[{"id":"a","count":1e3}]', r"field 'count' must be an integer"),
        ('[{"id":"a","devmem":2147483648}]', r"field 'devmem' '2147483648' is out of range"),
        ('[{"id":"a","index":-1}]', r"field 'index' '-1' is out of range"),
        ('[{"id":"a","health":"true"}]', r"field 'health' must be true or false"),
        ('[{"id":5}]', r"field 'id' must be a JSON string"),
        ('[{"id":"a","custominfo":[]}]', r"field 'custominfo' must be a JSON object"),
        ('[{"id":"a","devicepairscore":{"score":{"x":"1"}}}]', r"field 'score'.x must be an integer"),
        ("[NaN]", r"NaN is not JSON"),
        ('[{"count":1}]', r"id '' must be non-empty"),
        ('[{"id":"a:b"}]', r"id 'a:b' must be non-empty and free of"),
        ('[{"id":"a"},{"ID":"a"}]', r"id 'a' is registered twice"),
        ('[{"id":"a","count":-1}]', r"count is negative"),
    ],
)
def test_malformed_registrations_are_named_by_default(value: str, message: str) -> None:
    with pytest.raises(NodeRegisterError, match=message):
        decode_npu_register(value)


@pytest.mark.parametrize(
    "value", ["not json", "[1]", "[null]", '[{"id":"a","count":1.0}]', '[{"id":"a","devmem":2147483648}]']
)
def test_volcano_sees_no_chip_when_the_registration_fails(value: str) -> None:
    assert decode_npu_register(value, "volcano") == []


def test_a_deeply_nested_registration_is_malformed_not_a_crash() -> None:
    """json.loads recurses per bracket: a broken annotation must not raise RecursionError out of
    a scheduler's or inspect's reading of the node."""
    value = "[" * 100_000
    with pytest.raises(
        NodeRegisterError, match=r"node registration '\[\[.*\(100000 characters\) is nested too deeply"
    ):
        decode_npu_register(value)
    assert decode_npu_register(value, "volcano") == []


def test_registration_names_are_read_as_go_reads_them() -> None:
    value = '[{"ID":"a","Count":1,"count":7,"DEVMEM":21527,"devcore":null,"unknown":[1],"Health":true}]'
    assert decode_npu_register(value) == [NpuInfo(id="a", count=7, devmem=21527, health=True)]
    assert decode_npu_register("null") == [] == decode_npu_register("[]")


def test_volcano_keeps_the_last_chip_of_a_duplicate_id() -> None:
    chips = decode_npu_register('[{"id":"a","count":1},{"id":"a","count":2}]', "volcano")
    assert [(chip.id, chip.count) for chip in chips] == [("a", 2)]


# --- the ledger annotation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("NPU-A,Ascend310P,6144,0", r"must end with ';'"),
        ("NPU-A,Ascend310P,6144:;", r"expected 4 fields"),
        ("NPU-A,Ascend310P,x,0:;", r"memory 'x' is not"),
    ],
)
def test_malformed_ledger_values_are_named_by_default(value: str, message: str) -> None:
    with pytest.raises(PodDevicesError, match=message):
        FAMILY.book(
            [card("NPU-A")], npu_pod("held", annotations={ALLOCATED: value}), None, DEFAULT_VGPU_CONFIG
        )


@pytest.mark.parametrize(
    ("value", "booked"),
    [
        ("NPU-A,Ascend310P,x,0:;", (1, 0)),  # a bad number reads as 0
        ("NPU-A,Ascend310P,99999999999,0:;", (1, 2**31 - 1)),  # clamped to int32
        ("NPU-A,Ascend310P:;", (0, 0)),  # a short entry voids the value
    ],
)
def test_volcano_reads_ledger_numbers_as_go(value: str, booked: tuple[int, int]) -> None:
    cards = [card("NPU-A")]
    FAMILY.book(cards, npu_pod("held", annotations={ALLOCATED: value}), "volcano", DEFAULT_VGPU_CONFIG)
    assert (cards[0].used_num, cards[0].used_memory) == booked


# --- pod requests --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "annotations", "message"),
    [
        ({COUNT: "500m"}, {}, r"huawei.com/Ascend310P must be a non-negative whole number, not '500m'"),
        ({COUNT: "1", MEMORY: "-1"}, {}, r"Ascend310P-memory must be a non-negative whole number"),
        ({COUNT: "1", MEMORY: "lots"}, {}, r"is not a Kubernetes quantity"),
        ({CORE: "2"}, {}, r"need a limit of huawei.com/Ascend310P"),
        ({COUNT: "0", MEMORY: "3072"}, {}, r"need a limit of huawei.com/Ascend310P"),
        ({COUNT: "1", CORE: "101"}, MODE, r"Ascend310P-core is 101; a hami-core card has 100"),
        ({COUNT: "1", MEMORY: "24577"}, {}, r"above the 24576 MiB"),
    ],
)
def test_malformed_requests_are_refused_by_default(
    limits: dict[str, str], annotations: dict[str, str], message: str
) -> None:
    with pytest.raises(RequestError, match=message):
        FAMILY.request(npu_pod("p", limits, annotations=annotations), None)


def test_volcano_reads_odd_requests_as_numbers() -> None:
    [request] = FAMILY.request(npu_pod("p", {COUNT: "500m", MEMORY: "-1", CORE: "2"}), "volcano").containers
    assert (request.nums, request.memory, request.cores) == (0, -1, 2)
    wrapped = FAMILY.request(npu_pod("p", {MEMORY: str(2**32 + 5)}), "volcano").containers[0]
    assert (wrapped.nums, wrapped.memory) == (1, 5)  # int32 of the quantity
    assert not FAMILY.request(npu_pod("p", {CORE: "2"}), "volcano").wants  # cores alone ask nothing


def test_init_containers_get_no_vnpu_by_default() -> None:
    asking = pod("p", [container("main")], init_containers=[container("init", {COUNT: "1"})])
    with pytest.raises(RequestError, match=r"init container 'init'"):
        FAMILY.request(asking, None)
    assert not FAMILY.request(asking, "volcano").wants
