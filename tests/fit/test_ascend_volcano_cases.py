"""Volcano's own tests of its HAMi-mode Ascend code, transcribed case by case
(`pkg/scheduler/api/devices/ascend/hami/device_info_test.go` @ ed72c7c815a9, and the three vnpus
cases of `devices/config/config_test.go`). Each case keeps its upstream name; where a case
calls an internal function, the test calls the function here that plays its part. Cases run
under compat="volcano", and under the default too where the two modes agree.
"""

from __future__ import annotations

import re
import time
from datetime import datetime

import pytest
import yaml

from deviceplugin.fit.ascend import card_fits, card_score, fit_ascend, trim_memory
from deviceplugin.fit.ascend_bind import NODE_LOCK, ascend_release_keys, node_lock_held, node_lock_value
from deviceplugin.fit.ascend_config import ASCEND310P, vnpus_config
from deviceplugin.fit.ascend_usage import add_ascend_pod
from deviceplugin.fit.families.ascend import AscendFamily
from deviceplugin.fit.model import DEFAULT_VGPU_CONFIG, Compat, ContainerRequest, GpuState
from tests.fit.ascend_builders import card, chip, node
from tests.fit.builders import pod

BOTH: tuple[Compat, ...] = (None, "volcano")
NS = 1_000_000_000

# --- Test_trimMemory ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "memory", "trimmed"),
    [
        ("test1", 0, 3072),
        ("test2", 1, 3072),
        ("test3", 100, 3072),
        ("test4", 3071, 3072),
        ("test5", 3072, 3072),
        ("test6", 3073, 6144),
        ("test7", 6143, 6144),
        ("test8", 6144, 6144),
        ("test9", 6144, 6144),
        ("test10", 6145, 12288),
        ("test11", 12288, 12288),
        ("test12", 12289, 21527),
        ("test13", 21527, 21527),
        ("test14", 21528, 21527),
        ("test15", 24576, 21527),
        ("test16", 24577, 0),
    ],
)
def test_trim_memory(name: str, memory: int, trimmed: int) -> None:
    assert trim_memory(ASCEND310P, memory)[0] == trimmed


# --- Test_fit -----------------------------------------------------------------------------------

_ID = "68496E64-20E05477-92C31323-6E78030A-BD003019"


@pytest.mark.parametrize(
    ("name", "memory", "cores", "used", "node_hami_core", "hami_core", "fits"),
    [
        ("test1", 1024, 0, (1, 3072, 0), False, False, True),
        ("test2", 21527, 0, (1, 3072, 0), False, False, False),
        ("test3", 6144, 0, (1, 12288, 0), False, False, True),
        ("test4", 24576, 0, (0, 0, 0), False, False, False),
        ("test5_core", 6144, 4, (1, 12288, 6), False, False, False),
        (
            "hami_core_mode_should_fail_when_node_not_support_hami_vnpu_core",
            1024,
            20,
            (0, 0, 0),
            False,
            True,
            False,
        ),
        ("hami_core_mode_should_fail_when_core_is_insufficient", 1024, 20, (0, 0, 90), True, True, False),
        (
            "hami_core_mode_should_pass_when_node_support_hami_vnpu_core",
            1024,
            20,
            (0, 0, 0),
            True,
            True,
            True,
        ),
    ],
)
@pytest.mark.parametrize("volcano", [False, True])
def test_fit(
    name: str,
    memory: int,
    cores: int,
    used: tuple[int, int, int],
    node_hami_core: bool,
    hami_core: bool,
    fits: bool,
    volcano: bool,
) -> None:
    device = card(_ID, count=7, cores=8, memory=21527, used=used, hami_core=node_hami_core)
    assert card_fits(device, memory, cores, hami_core, volcano) is fits


# --- TestAscendDevicesFilterNodeErrorClassification -----------------------------------------------

_910A = chip("Ascend910A", 32768)


def _allocate_device(uuid: str, used: tuple[int, int, int] = (0, 0, 0)) -> GpuState:
    """createTestAscendAllocateDevice: count 1, devcore 30, devmem 32768."""
    return card(uuid, count=1, cores=30, memory=32768, used=used)


def _worker(count: str, memory: str) -> dict[str, object]:
    limits = {"huawei.com/Ascend910A": count, "huawei.com/Ascend910A-memory": memory}
    return pod("worker", [{"name": "worker", "resources": {"limits": limits}}])


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    ("name", "devices", "templates", "count", "reason"),
    [
        # Volcano: Unschedulable (retryable)
        ("insufficient device capacity is retryable", [("device-1", (1, 32768, 0))], (), "1", r"0 of the 1 "),
        # Volcano: Error
        ("missing device inventory is an error", [], (), "1", r"no Ascend910A card is registered"),
        ("invalid multi-device partial memory request is an error", [("device-1", (0, 0, 0))],
         (("vir01", 4096),), "2", r"must be whole cards"),
    ],
)  # fmt: skip
def test_filter_node_error_classification(
    name: str,
    devices: list[tuple[str, tuple[int, int, int]]],
    templates: tuple[tuple[str, int], ...],
    count: str,
    reason: str,
    compat: Compat,
) -> None:
    chip_config = chip("Ascend910A", 32768, templates)
    family = AscendFamily(chip_config)
    worker = _worker(count, "32768" if count == "1" else "4096")
    cards = [_allocate_device(uuid, used) for uuid, used in devices]
    result = fit_ascend(
        cards, worker, family.request(worker, compat).containers, chip_config, policy="binpack", compat=compat
    )
    assert not result.ok
    assert re.search(reason, result.reason)


# --- TestAscendDevice_GetNodeDevices_HAMiVnpuCore ------------------------------------------------


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    ("name", "selector", "support"),
    [
        ("node_support_hami_vnpu_core", "true", True),
        ("node_not_support_hami_vnpu_core", "false", False),
        ("node_without_hami_vnpu_core_annotation", None, False),
    ],
)
def test_get_node_devices_hami_vnpu_core(
    name: str, selector: str | None, support: bool, compat: Compat
) -> None:
    notes = {
        "hami.io/node-register-Ascend910A": '[{"id":"dev-1","index":0,"count":1,"devmem":32768,"devcore":30}]'
    }
    if selector is not None:
        notes["hami-vnpu-core"] = selector
    cards = AscendFamily(_910A).node_gpus(
        node(notes, {"huawei.com/Ascend910A": "1"}), DEFAULT_VGPU_CONFIG, compat
    )
    assert [c.uuid for c in cards] == ["dev-1"]
    assert (cards[0].mode == "hami-core") is support


# --- Test_verifyReq (through the fit: verifyReq runs inside selectDevices) -----------------------


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    ("name", "nums", "memory", "passes"),
    [
        ("single_device_with_partial_memory_should_pass", 1, 1024, True),
        ("multiple_devices_with_partial_memory_should_fail", 2, 1024, False),
        ("multiple_devices_with_full_memory_should_pass", 2, 21527, True),
    ],
)
def test_verify_req(name: str, nums: int, memory: int, passes: bool, compat: Compat) -> None:
    request = ContainerRequest("c", nums, "Ascend310P", memory=memory)
    cards = [card("A"), card("B", index=1)]
    result = fit_ascend(cards, pod("p"), [request], ASCEND310P, policy="binpack", compat=compat)
    assert result.ok is passes
    assert passes or "must be whole cards" in result.reason


# --- TestAscendDevices_AddResource (Volcano's ledger: compat="volcano") ---------------------------

_910 = chip("Ascend910", 32000)
_KEY = "hami.io/Ascend910-devices-allocated"


def _test_device(uuid: str, used: tuple[int, int, int] = (0, 0, 0)) -> GpuState:
    """createTestAscendDevice(id, 100 cores, 32000 MiB, ...), count 1."""
    return card(uuid, count=1, cores=100, memory=32000, used=used)


@pytest.mark.parametrize(
    ("name", "devices", "value", "times", "expected"),
    [
        ("Successfully add single device resource", ["device-1"], "device-1,Ascend910,16000,50", 1,
         {"device-1": (1, 16000, 50)}),
        ("Successfully add multiple device resources", ["device-1", "device-2"],
         "device-1,Ascend910,8000,25:device-2,Ascend910,8000,25", 1,
         {"device-1": (1, 8000, 25), "device-2": (1, 8000, 25)}),
        ("Add same pod multiple times - should not duplicate", ["device-1"], "device-1,Ascend910,16000,50", 2,
         {"device-1": (1, 16000, 50)}),
        ("Pod has invalid annotation format", ["device-1"], "invalid format", 1, {"device-1": (0, 0, 0)}),
        ("Pod missing required annotation", ["device-1"], None, 1, {"device-1": (0, 0, 0)}),
        ("Device not found in devices map", ["device-1"], "non-existent-device,Ascend910,16000,50", 1,
         {"device-1": (0, 0, 0)}),
        ("Multiple containers with different devices", ["device-1", "device-2", "device-3"],
         "device-1,Ascend910,4000,10:device-2,Ascend910,4000,10", 1,
         {"device-1": (1, 4000, 10), "device-2": (1, 4000, 10), "device-3": (0, 0, 0)}),
    ],
)  # fmt: skip
def test_add_resource(
    name: str, devices: list[str], value: str | None, times: int, expected: dict[str, tuple[int, int, int]]
) -> None:
    cards = [_test_device(uuid) for uuid in devices]
    placed = pod("test-pod", namespace="ns1", annotations={} if value is None else {_KEY: value})
    for _ in range(times):
        add_ascend_pod(cards, placed, _910, "volcano")
    assert {c.uuid: (c.used_num, c.used_memory, c.used_cores) for c in cards} == expected


def test_add_resource_accumulates_on_existing_usage() -> None:
    """Upstream "Add resource to existing device usage - accumulate": one pod already holds 8000."""
    device = _test_device("device-1")
    add_ascend_pod(
        [device], pod("existing-pod", annotations={_KEY: "device-1,Ascend910,8000,25"}), _910, "volcano"
    )
    add_ascend_pod(
        [device], pod("new-pod", annotations={_KEY: "device-1,Ascend910,8000,25"}), _910, "volcano"
    )
    assert (device.used_num, device.used_memory, device.used_cores) == (2, 16000, 50)


@pytest.mark.parametrize(
    "value", ["device-1,Ascend910,16000,50:;", "device-1,Ascend910,8000,25:device-2,Ascend910,8000,25:;"]
)
def test_add_resource_default_mode_reads_what_volcano_writes(value: str) -> None:
    """The default decoder reads the values as Volcano's bind writes them (each container ended
    by `;`, which the upstream cases leave out) and books the same."""
    by_mode = []
    for compat in BOTH:
        cards = [_test_device("device-1"), _test_device("device-2")]
        add_ascend_pod(cards, pod("p", annotations={_KEY: value}), _910, compat)
        by_mode.append([(c.used_num, c.used_memory, c.used_cores) for c in cards])
    assert by_mode[0] == by_mode[1]


# The upstream "Nil AscendDevices receiver" case checks a Go nil receiver; there is none here.

# --- TestAllocateAddsNodeLockAscendWhenEnabled ---------------------------------------------------


def test_allocate_adds_node_lock() -> None:
    now = time.time_ns()
    value = node_lock_value(now)
    assert NODE_LOCK == "hami.io/mutex.lock"
    assert datetime.strptime(value, "%Y-%m-%dT%H:%M:%S%z").timestamp() == now // NS  # RFC 3339
    assert node_lock_held(value, now)  # a second bind within 5 minutes waits
    assert not node_lock_held(value, now + 301 * NS)  # an older lock is taken over
    assert not node_lock_held(None, now)
    assert node_lock_held("not a time", now)  # Volcano's LockNode fails on it


# --- TestHAMiRelease... ---------------------------------------------------------------------------

_RELEASE_CHIP = chip("Ascend910A", 32768)


def _hami_pod_annotations(phase: str) -> dict[str, str]:
    return {
        "hami.io/vgpu-node": "node-a",
        "hami.io/vgpu-time": "1700000000",
        "hami.io/bind-phase": phase,
        "hami.io/bind-time": "1700000000",
        "predicate-time": "1700000000",
        "hami.io/Ascend910A-devices-to-allocate": "GPU-aaaa,Ascend910A,4096,0",
        "hami.io/Ascend910A-devices-allocated": "GPU-aaaa,Ascend910A,4096,0",
        "huawei.com/Ascend910A": '[{"UUID":"GPU-aaaa","Temp":"vir04"}]',
        "keep-me": "yes",
    }


def test_hami_release_returns_speculative_annotation_keys() -> None:
    notes = _hami_pod_annotations("allocating")
    dropped = set(ascend_release_keys(notes, [_RELEASE_CHIP]))
    assert set(notes) - dropped == {"keep-me"}


def test_hami_release_keeps_committed_annotations() -> None:
    assert ascend_release_keys(_hami_pod_annotations("success"), [_RELEASE_CHIP]) == ()


# --- TestCalScore --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "policy", "used_num", "used_memory", "memory", "score"),
    [
        ("spread rewards idle device", "spread", 0, 0, 32768, 100),
        ("devmem is zero", "spread", 0, 0, 0, 0),
        ("binpack devmem is zero", "binpack", 0, 0, 0, 0),
        ("spread does not reward shared device", "spread", 1, 0, 32768, 0),
        ("binpack rewards full device most", "binpack", 0, 32768, 32768, 100),
        ("binpack does not reward idle device", "binpack", 0, 0, 32768, 0),
        ("binpack scales with memory usage", "binpack", 0, 16384, 32768, 50),
    ],
)
def test_cal_score(
    name: str, policy: str, used_num: int, used_memory: int, memory: int, score: float
) -> None:
    assert card_score(policy, card("d", memory=memory, used=(used_num, used_memory, 0))) == score


# --- config_test.go: the vnpus section ------------------------------------------------------------

_WRAPPER = """
vnpus:
  hamiVnpuCore: false
  configs:
  - chipName: 910A
    commonWord: Ascend910A
    resourceName: huawei.com/Ascend910A
    resourceMemoryName: huawei.com/Ascend910A-memory
    memoryAllocatable: 32768
    memoryCapacity: 32768
    aiCore: 30
    templates:
      - name: vir02
        memory: 2184
        aiCore: 2
"""
_LEGACY = """
vnpus:
- chipName: 910A
  commonWord: Ascend910A
  resourceName: huawei.com/Ascend910A
  resourceMemoryName: huawei.com/Ascend910A-memory
  memoryAllocatable: 32768
  memoryCapacity: 32768
  aiCore: 30
  templates:
    - name: vir02
      memory: 2184
      aiCore: 2
- chipName: 310P3
  commonWord: Ascend310P
  resourceName: huawei.com/Ascend310P
  resourceMemoryName: huawei.com/Ascend310P-memory
  memoryAllocatable: 21527
  memoryCapacity: 24576
  aiCore: 8
  aiCPU: 7
  templates:
    - name: vir01
      memory: 3072
      aiCore: 1
      aiCPU: 1
"""


@pytest.mark.parametrize("compat", BOTH)
def test_parse_vnpus_new_wrapper_format(compat: Compat) -> None:
    config = vnpus_config(yaml.safe_load(_WRAPPER), compat)
    assert config.hami_vnpu_core is False
    [only] = config.chips
    assert (only.chip_name, only.common_word, only.memory_allocatable) == ("910A", "Ascend910A", 32768)
    assert [t.name for t in only.templates] == ["vir02"]


@pytest.mark.parametrize("compat", BOTH)
def test_parse_vnpus_legacy_array_format(compat: Compat) -> None:
    config = vnpus_config(yaml.safe_load(_LEGACY), compat)
    assert config.hami_vnpu_core is False
    assert [(c.chip_name, c.common_word) for c in config.chips] == [
        ("910A", "Ascend910A"),
        ("310P3", "Ascend310P"),
    ]
    assert config.chips[1].memory_allocatable == 21527


@pytest.mark.parametrize("compat", BOTH)
def test_parse_vnpus_wrapper_with_empty_configs(compat: Compat) -> None:
    config = vnpus_config(yaml.safe_load("vnpus:\n  hamiVnpuCore: true\n  configs: []\n"), compat)
    assert config.hami_vnpu_core is True
    assert config.chips == ()
