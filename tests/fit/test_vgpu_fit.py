"""vGPU fit: card order, per-card skip rules in order, scores, filters, modes, pod groups,
exclusivity and rollback (semantics reference §3.5-3.9; defaults in docs/fit.md)."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from deviceplugin.fit import (
    Compat,
    ConfigError,
    FitResult,
    GpuState,
    VgpuConfig,
    add_vgpu_pod,
    fit_vgpu,
    gpu_score,
    node_score,
    parse_vgpu_requests,
)
from tests.fit.builders import CORES, MEM, NUM, PCT, container, gpus, pod

BOTH: list[Compat] = [None, "volcano"]
WITH_PERCENT = VgpuConfig(percentage_resource=PCT)
DEFAULT_CONFIG = VgpuConfig()


def book(
    cards: Sequence[GpuState],
    uuid: str,
    memory: int,
    cores: int = 0,
    *,
    name: str = "",
    compat: Compat = None,
    **pod_args: Any,
) -> None:
    """Put a running tenant pod on card `uuid` through its `vgpu-ids-new` annotation."""
    name = name or f"tenant-{uuid}-{len(cards[0].pods)}-{sum(len(c.pods) for c in cards)}"
    annotations = {
        "volcano.sh/vgpu-ids-new": f"{uuid},NVIDIA,{memory},{cores}:",
        **pod_args.pop("annotations", {}),
    }
    add_vgpu_pod(cards, pod(name, [], annotations=annotations, **pod_args), compat)


def fit(
    cards: Sequence[GpuState],
    *limits: Mapping[str, Any],
    policy: str | None = None,
    compat: Compat = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    config: VgpuConfig = DEFAULT_CONFIG,
    rules: Sequence[Mapping[str, str]] = (),
) -> FitResult:
    """Fit a pod whose containers c0, c1, ... limit `limits` in turn."""
    p = pod(
        "new",
        [container(f"c{i}", lim) for i, lim in enumerate(limits)],
        annotations=annotations,
        labels=labels,
    )
    requests = parse_vgpu_requests(p, config, compat)
    return fit_vgpu(cards, requests, p, policy, compat, config=config, exclusive_rules=rules)


def chosen(result: FitResult) -> list[list[str]]:
    assert result.ok, result.reason
    return [[device.uuid for device in devices] for devices in result.devices]


# --- card order ------------------------------------------------------------------------------


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    ("policy", "usage", "nums", "expected"),
    [
        ("binpack", {}, 1, ["GPU-0"]),  # ties: lower index
        ("binpack", {"GPU-1": [4000], "GPU-2": [8000]}, 1, ["GPU-2"]),
        ("binpack", {"GPU-1": [4000], "GPU-2": [8000]}, 2, ["GPU-2", "GPU-1"]),
        ("binpack", {"GPU-0": [1000, 1000, 1000], "GPU-1": [5000]}, 1, ["GPU-1"]),  # memory, not tenants
        ("spread", {}, 1, ["GPU-0"]),
        ("spread", {"GPU-0": [100, 100], "GPU-1": [100], "GPU-2": [100]}, 1, ["GPU-1"]),
        ("spread", {"GPU-0": [100, 100], "GPU-1": [9000]}, 2, ["GPU-2", "GPU-1"]),  # tenants, not memory
        (None, {}, 1, ["GPU-2"]),  # unset: highest index first
        (None, {}, 3, ["GPU-2", "GPU-1", "GPU-0"]),
        (None, {"GPU-2": [15500]}, 1, ["GPU-1"]),
    ],
)
def test_card_order(
    compat: Compat, policy: str | None, usage: dict[str, list[int]], nums: int, expected: list[str]
) -> None:
    cards = gpus(16000, 16000, 16000)
    for uuid, memories in usage.items():
        for n, memory in enumerate(memories):
            book(cards, uuid, memory, name=f"t-{uuid}-{n}", compat=compat)
    result = fit(cards, {NUM: str(nums), MEM: "1000"}, policy=policy, compat=compat)
    assert chosen(result) == [expected]


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    ("policy", "expected"),
    [("binpack", [["GPU-0"], ["GPU-0"]]), ("spread", [["GPU-0"], ["GPU-1"]]), (None, [["GPU-1"], ["GPU-1"]])],
)
def test_later_containers_see_earlier_ones(
    compat: Compat, policy: str | None, expected: list[list[str]]
) -> None:
    cards = gpus(16000, 16000)
    result = fit(cards, {NUM: "1", MEM: "1000"}, {NUM: "1", MEM: "1000"}, policy=policy, compat=compat)
    assert chosen(result) == expected


def test_a_card_is_used_once_per_container() -> None:
    result = fit(gpus(16000, 16000), {NUM: "2", MEM: "100"}, policy="binpack")
    assert sorted(chosen(result)[0]) == ["GPU-0", "GPU-1"]


def test_unknown_policy_is_a_config_error_by_default_and_unset_in_volcano() -> None:
    with pytest.raises(ConfigError, match="schedule policy"):
        fit(gpus(1000, 1000), {NUM: "1", MEM: "10"}, policy="pack")
    assert chosen(fit(gpus(1000, 1000), {NUM: "1", MEM: "10"}, policy="pack", compat="volcano")) == [
        ["GPU-1"]
    ]


# --- per-card rules --------------------------------------------------------------------------


@pytest.mark.parametrize("compat", BOTH)
def test_share_slots(compat: Compat) -> None:
    cards = gpus(16000, 16000, split=2)
    book(cards, "GPU-0", 100, name="a", compat=compat)
    book(cards, "GPU-0", 100, name="b", compat=compat)
    result = fit(cards, {NUM: "1", MEM: "100"}, policy="binpack", compat=compat)
    assert chosen(result) == [["GPU-1"]]
    cards[1].split_count = 0
    result = fit(cards, {NUM: "1", MEM: "100"}, policy="binpack", compat=compat)
    assert not result.ok
    assert "GPU 0 (GPU-0): all 2 shares taken" in result.reason


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    ("used", "asked", "fits"),
    [(15000, 1000, True), (15000, 1001, False), (0, 16000, True), (0, 16001, False), (16500, 1, False)],
)
def test_memory(compat: Compat, used: int, asked: int, fits: bool) -> None:
    cards = gpus(16000)
    if used:
        book(cards, "GPU-0", used, compat=compat)
    result = fit(cards, {NUM: "1", MEM: str(asked)}, compat=compat)
    assert result.ok is fits
    if not fits:
        assert f"of 16000 MiB free, needs {asked}" in result.reason


@pytest.mark.parametrize("compat", BOTH)
def test_refusals_count_memory_in_the_nodes_units(compat: Compat) -> None:
    """With a memory factor the registration and the request count units of that many MiB: the
    reason says so rather than calling the units MiB."""
    cards = gpus(4000)  # a 16000 MiB card registered at factor 4
    result = fit(cards, {NUM: "1", MEM: "5000"}, compat=compat, config=VgpuConfig(memory_factor=4))
    assert not result.ok
    assert "(1 GPU(s) of 5000 units of 4 MiB and 0 cores)" in result.reason
    assert "4000 of 4000 units of 4 MiB free, needs 5000" in result.reason


def test_over_subscribed_card_refuses_even_a_zero_memory_request_in_volcano() -> None:
    cards = gpus(16000)
    book(cards, "GPU-0", 16500, compat="volcano")
    result = fit(cards, {NUM: "1", PCT: "0"}, compat="volcano", config=WITH_PERCENT)
    assert not result.ok  # signed arithmetic: 16000 - 16500 < 0
    assert "0 of 16000 MiB free, needs 0" in result.reason


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    ("tenant_cores", "request_cores", "fits", "why"),
    [
        (80, 20, True, ""),
        (80, 21, False, "80 of 100 cores used, needs 21"),
        (0, 100, False, "shared, but the request wants the whole GPU's cores"),
        (100, 0, False, "all cores taken; a zero-core request cannot share it"),
        (50, 0, True, ""),
    ],
)
def test_cores(compat: Compat, tenant_cores: int, request_cores: int, fits: bool, why: str) -> None:
    cards = gpus(16000)
    book(cards, "GPU-0", 100, tenant_cores, compat=compat)
    result = fit(cards, {NUM: "1", MEM: "100", CORES: str(request_cores)}, compat=compat)
    assert result.ok is fits
    assert why in result.reason


@pytest.mark.parametrize("compat", BOTH)
def test_whole_card_cores_on_an_idle_card(compat: Compat) -> None:
    assert chosen(fit(gpus(16000), {NUM: "1", MEM: "100", CORES: "100"}, compat=compat)) == [["GPU-0"]]


def test_card_core_capacity_is_honoured_by_default_only() -> None:
    cards = gpus(16000)
    cards[0].cores = 50
    assert not fit(cards, {NUM: "1", MEM: "100", CORES: "60"}).ok
    assert fit(cards, {NUM: "1", MEM: "100", CORES: "60"}, compat="volcano").ok


@pytest.mark.parametrize("compat", BOTH)
def test_request_type_must_occur_in_card_type(compat: Compat) -> None:
    cards = gpus(16000, kind="AMD-MI300X")
    result = fit(cards, {NUM: "1", MEM: "100"}, compat=compat)
    assert not result.ok
    assert "type 'AMD-MI300X' not allowed" in result.reason


@pytest.mark.parametrize(
    ("compat", "setup", "expected_reason"),
    [
        # slots exhausted is checked before memory
        (None, "full-slots-and-memory", "all 1 shares taken"),
        ("volcano", "full-slots-and-memory", "all 1 shares taken"),
        # UUID filter comes before everything Volcano checks
        ("volcano", "uuid-and-slots", "excluded by the pod's GPU UUID annotations"),
        # memory before cores
        (None, "memory-and-cores", "1000 of 16000 MiB free, needs 2000"),
        # health and mode come first by default
        (None, "unhealthy-and-full", "unhealthy"),
    ],
)
def test_first_failing_rule_is_reported(compat: Compat, setup: str, expected_reason: str) -> None:
    cards = gpus(16000, split=1)
    annotations: dict[str, str] = {}
    if setup in ("full-slots-and-memory", "unhealthy-and-full"):
        book(cards, "GPU-0", 16000, compat=compat)
    if setup == "uuid-and-slots":
        book(cards, "GPU-0", 100, compat=compat)
        annotations["volcano.sh/vgpu-nouse-gpuuuid"] = "GPU-0"
    if setup == "memory-and-cores":
        cards[0].split_count = 10
        book(cards, "GPU-0", 15000, 90, compat=compat)
    if setup == "unhealthy-and-full":
        cards[0].health = False
    result = fit(cards, {NUM: "1", MEM: "2000", CORES: "20"}, compat=compat, annotations=annotations)
    assert not result.ok
    reason = result.reason.split("[", 1)[1]
    assert reason.startswith(f"GPU 0 (GPU-0): {expected_reason}")


def test_health_is_respected_by_default_and_ignored_by_volcano() -> None:
    cards = gpus(16000, 16000)
    cards[0].health = False
    book(cards, "GPU-0", 4000)
    assert chosen(fit(cards, {NUM: "1", MEM: "1000"}, policy="binpack")) == [["GPU-1"]]
    assert chosen(fit(cards, {NUM: "1", MEM: "1000"}, policy="binpack", compat="volcano")) == [["GPU-0"]]


@pytest.mark.parametrize("compat", BOTH)
def test_too_many_gpus_requested(compat: Compat) -> None:
    result = fit(gpus(16000, 16000), {NUM: "3", MEM: "10"}, compat=compat)
    assert not result.ok
    assert "needs 3 GPUs; the node has 2" in result.reason


# --- memory percentage, cores over 100, zero counts ------------------------------------------


@pytest.mark.parametrize("compat", BOTH)
def test_percentage_is_computed_per_card(compat: Compat) -> None:
    cards = gpus(16000, 32000, 10001)
    result = fit(cards, {NUM: "3", PCT: "33"}, compat=compat, config=WITH_PERCENT)
    assert result.ok, result.reason
    by_card = {d.uuid: d.memory for d in result.devices[0]}
    assert by_card == {"GPU-0": 5280, "GPU-1": 10560, "GPU-2": 3300}


def test_volcano_percentage_zero_books_nothing_and_over_100_never_fits() -> None:
    zero = fit(gpus(16000), {NUM: "1", PCT: "0"}, compat="volcano", config=WITH_PERCENT)
    assert zero.ok
    assert zero.devices[0][0].memory == 0
    over = fit(gpus(16000), {NUM: "1", PCT: "150"}, compat="volcano", config=WITH_PERCENT)
    assert not over.ok
    assert "16000 of 16000 MiB free, needs 24000" in over.reason


def test_volcano_cores_over_100_never_fit() -> None:
    result = fit(gpus(16000, 16000), {NUM: "1", MEM: "10", CORES: "150"}, compat="volcano")
    assert not result.ok
    assert "0 of 100 cores used, needs 150" in result.reason


def test_volcano_zero_count_container_books_a_card_invisibly() -> None:
    """B20: `vgpu-number: 0` still takes a share slot on the first fitting card."""
    cards = gpus(16000, split=1)
    result = fit(cards, {NUM: "0", MEM: "100"}, compat="volcano")
    assert result.ok
    assert result.devices == ((),)
    second = fit(cards, {NUM: "0", MEM: "100"}, {NUM: "1", MEM: "100"}, compat="volcano")
    assert not second.ok
    assert "all 1 shares taken" in second.reason
    # The default refuses the request instead of guessing what it meant.
    with pytest.raises(ValueError, match="is 0 but GPU memory or cores are requested"):
        fit(cards, {NUM: "0", MEM: "100"})


# --- scores ----------------------------------------------------------------------------------


@pytest.mark.parametrize("compat", BOTH)
def test_binpack_score_worked_example(compat: Compat) -> None:
    """Upstream TestVgpuScore: 30000 MiB card with 3000 used, pod of 1000 -> 13.33, node 13 x weight."""
    cards = gpus(30000)
    book(cards, "GPU-0", 3000, compat=compat)
    result = fit(cards, {NUM: "1", MEM: "1000"}, policy="binpack", compat=compat)
    assert result.score == pytest.approx(100 * 4000 / 30000)
    assert node_score(result.score, 1) == 13
    assert node_score(result.score, 3) == 39


@pytest.mark.parametrize("compat", BOTH)
def test_binpack_score_sums_cards(compat: Compat) -> None:
    cards = gpus(10000, 20000)
    result = fit(cards, {NUM: "2", MEM: "5000"}, policy="binpack", compat=compat)
    assert result.score == pytest.approx(50.0 + 25.0)


@pytest.mark.parametrize(
    ("compat", "tenants", "expected"),
    [(None, 0, 100.0), (None, 1, 0.0), ("volcano", 0, 0.0), ("volcano", 1, 0.0)],
)
def test_spread_score(compat: Compat, tenants: int, expected: float) -> None:
    cards = gpus(16000)
    for n in range(tenants):
        book(cards, "GPU-0", 100, name=f"t{n}", compat=compat)
    assert fit(cards, {NUM: "1", MEM: "100"}, policy="spread", compat=compat).score == expected


@pytest.mark.parametrize("compat", BOTH)
def test_unset_policy_scores_zero(compat: Compat) -> None:
    assert fit(gpus(16000), {NUM: "1", MEM: "8000"}, compat=compat).score == 0.0


@pytest.mark.parametrize(
    ("policy", "compat", "expected"),
    [
        ("binpack", None, 40.0),
        ("binpack", "volcano", 40.0),
        ("spread", None, 100.0),
        ("spread", "volcano", 0.0),
        (None, None, 0.0),
        ("", "volcano", 0.0),
    ],
)
def test_gpu_score_after_the_add(policy: str | None, compat: Compat, expected: float) -> None:
    card = GpuState(index=0, uuid="GPU-0", memory=10000, used_num=1, used_memory=4000)
    assert gpu_score(card, policy, compat) == expected


def test_gpu_score_of_a_card_without_memory() -> None:
    card = GpuState(index=0, uuid="GPU-0", memory=0, used_num=1, used_memory=0)
    assert gpu_score(card, "binpack") == 0.0
    assert math.isnan(gpu_score(card, "binpack", "volcano"))
    card.used_memory = 5
    assert gpu_score(card, "binpack", "volcano") == math.inf
    assert node_score(math.inf, 2) == float(-(2**63)) * 2  # Go's int(+Inf) on amd64


@pytest.mark.parametrize(
    ("score", "weight", "expected"),
    [(12.5, 1, 13.0), (12.49, 1, 12.0), (12.5, 0, 0.0), (99.0, -1, 0.0), (0.0, 5, 0.0), (37.5, 2, 76.0)],
)
def test_node_score(score: float, weight: int, expected: float) -> None:
    assert node_score(score, weight) == expected


# --- the documented seed examples ------------------------------------------------------------


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    ("policy", "gpu", "default_score", "volcano_score"),
    [("binpack", "GPU-0", 37.5, 37.5), ("spread", "GPU-1", 100.0, 0.0)],
)
def test_seed_vgpu_pod_under_binpack_and_spread(
    compat: Compat, policy: str, gpu: str, default_score: float, volcano_score: float
) -> None:
    """vgpu-number 1, vgpu-memory 4096 on 2 x 16384 MiB with 2048 MiB in use on GPU 0."""
    cards = gpus(16384, 16384)
    book(cards, "GPU-0", 2048, compat=compat)
    result = fit(cards, {NUM: "1", MEM: "4096"}, policy=policy, compat=compat)
    assert chosen(result) == [[gpu]]
    assert result.devices[0][0].memory == 4096
    assert result.devices[0][0].type == "NVIDIA"
    assert result.score == (volcano_score if compat else default_score)


# --- GPU type and UUID annotations -----------------------------------------------------------


TYPED = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-Tesla V100-PCIE-32GB", "NVIDIA-Tesla T4")


def typed_cards() -> list[GpuState]:
    return [GpuState(index=i, uuid=f"GPU-{i}", type=t, memory=16000) for i, t in enumerate(TYPED)]


@pytest.mark.parametrize(
    ("annotations", "policy", "volcano", "default"),
    [
        ({"nvidia.com/use-gputype": "A100,V100"}, None, ["GPU-1"], ["GPU-1"]),
        ({"nvidia.com/use-gputype": "a100"}, None, ["GPU-0"], ["GPU-0"]),
        ({"nvidia.com/nouse-gputype": "T4"}, None, ["GPU-1"], ["GPU-1"]),
        ({"nvidia.com/nouse-gputype": "T4,V100"}, None, ["GPU-0"], ["GPU-0"]),
        # use wins outright in Volcano; both apply by default
        ({"nvidia.com/use-gputype": "Tesla", "nvidia.com/nouse-gputype": "T4"}, None, ["GPU-2"], ["GPU-1"]),
        # an empty item matches every card in Volcano
        ({"nvidia.com/use-gputype": "H100,"}, None, ["GPU-2"], None),
        ({"nvidia.com/nouse-gputype": "T4,"}, None, None, ["GPU-1"]),
        # untrimmed in Volcano
        ({"nvidia.com/use-gputype": "A100, T4 "}, None, ["GPU-0"], ["GPU-2"]),
    ],
)
def test_type_annotations_in_the_fit(
    annotations: dict[str, str], policy: str | None, volcano: list[str] | None, default: list[str] | None
) -> None:
    for compat, expected in (("volcano", volcano), (None, default)):
        result = fit(
            typed_cards(),
            {NUM: "1", MEM: "100"},
            policy=policy,
            compat=compat,  # type: ignore[arg-type]
            annotations=annotations,
        )
        if expected is None:
            assert not result.ok
            assert "not allowed for this pod" in result.reason
        else:
            assert chosen(result) == [expected]


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({"volcano.sh/vgpu-use-gpuuuid": "GPU-1"}, ["GPU-1"]),
        ({"volcano.sh/vgpu-use-gpuuuid": " GPU-2 , GPU-0 ,"}, ["GPU-0"]),
        ({"volcano.sh/vgpu-nouse-gpuuuid": "GPU-0"}, ["GPU-1"]),
        ({"volcano.sh/vgpu-use-gpuuuid": "GPU-0,GPU-1", "volcano.sh/vgpu-nouse-gpuuuid": "GPU-0"}, ["GPU-1"]),
        ({"volcano.sh/vgpu-use-gpuuuid": ""}, ["GPU-0"]),
        ({"volcano.sh/vgpu-use-gpuuuid": "gpu-1"}, None),
        ({"volcano.sh/vgpu-use-gpuuuid": "GPU-9"}, None),
    ],
)
def test_uuid_annotations_in_the_fit(
    compat: Compat, annotations: dict[str, str], expected: list[str] | None
) -> None:
    result = fit(
        gpus(16000, 16000, 16000),
        {NUM: "1", MEM: "100"},
        policy="binpack",
        compat=compat,
        annotations=annotations,
    )
    if expected is None:
        assert not result.ok
        assert "no GPU matches the pod's GPU UUID annotations" in result.reason
    else:
        assert chosen(result) == [expected]


@pytest.mark.parametrize("compat", BOTH)
def test_uuid_match_but_no_room_says_so(compat: Compat) -> None:
    cards = gpus(16000, 16000)
    book(cards, "GPU-1", 16000, compat=compat)
    result = fit(
        cards, {NUM: "1", MEM: "100"}, compat=compat, annotations={"volcano.sh/vgpu-use-gpuuuid": "GPU-1"}
    )
    assert not result.ok
    assert "only 0 of 1 GPU(s) fit" in result.reason
    assert "GPU 1 (GPU-1): 0 of 16000 MiB free" in result.reason


# --- sharing mode ----------------------------------------------------------------------------


def test_default_mode_filters_cards() -> None:
    cards = gpus(16000, 16000)
    cards[1].mode = "mps"
    assert chosen(fit(cards, {NUM: "1", MEM: "10"}, annotations={"volcano.sh/vgpu-mode": "mps"})) == [
        ["GPU-1"]
    ]
    assert chosen(fit(cards, {NUM: "1", MEM: "10"}, annotations={"volcano.sh/vgpu-mode": "hami-core"})) == [
        ["GPU-0"]
    ]
    unset = fit(cards, {NUM: "1", MEM: "10"}, annotations={"volcano.sh/vgpu-nouse-gpuuuid": "GPU-0"})
    assert chosen(unset) == [["GPU-1"]]
    mig = fit(cards, {NUM: "1", MEM: "10"}, annotations={"volcano.sh/vgpu-mode": "mig"})
    assert not mig.ok
    assert "GPU 1 (GPU-1): runs mps, pod asks for mig" in mig.reason
    bogus = fit(cards, {NUM: "1", MEM: "10"}, annotations={"volcano.sh/vgpu-mode": "time-slicing"})
    assert not bogus.ok
    assert "'time-slicing' is not one of hami-core, mig, mps" in bogus.reason


def test_volcano_node_mode_is_the_last_cards() -> None:
    cards = gpus(16000, 16000)
    cards[0].mode = "mig"
    hami = {"volcano.sh/vgpu-mode": "hami-core"}
    assert fit(cards, {NUM: "1", MEM: "10"}, compat="volcano", annotations=hami).ok
    refused = fit(cards, {NUM: "1", MEM: "10"}, compat="volcano", annotations={"volcano.sh/vgpu-mode": "mig"})
    assert not refused.ok
    assert "asks for sharing mode 'mig'; the node runs 'hami-core'" in refused.reason
    cards[0].mode, cards[1].mode = "hami-core", "mig"
    assert not fit(cards, {NUM: "1", MEM: "10"}, compat="volcano", annotations=hami).ok


# --- pod groups and exclusivity --------------------------------------------------------------


SPREAD_GROUP = {"volcano.sh/vgpu-podgroup-policy": "spread", "scheduling.k8s.io/group-name": "job-1"}


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    ("tenant_annotations", "tenant_namespace", "tenant_memory", "pod_annotations", "expected"),
    [
        ({"scheduling.k8s.io/group-name": "job-1"}, "default", 1000, SPREAD_GROUP, "GPU-1"),
        ({"scheduling.volcano.sh/group-name": "job-1"}, "default", 1000, SPREAD_GROUP, "GPU-1"),
        ({"scheduling.k8s.io/group-name": "job-1"}, "default", 0, SPREAD_GROUP, "GPU-0"),  # no usage
        ({"scheduling.k8s.io/group-name": "job-2"}, "default", 1000, SPREAD_GROUP, "GPU-0"),
        ({"scheduling.k8s.io/group-name": "job-1"}, "other", 1000, SPREAD_GROUP, "GPU-0"),
        (
            {"scheduling.k8s.io/group-name": "job-1"},
            "default",
            1000,
            {"scheduling.k8s.io/group-name": "job-1"},
            "GPU-0",
        ),
    ],
)
def test_podgroup_spread(
    compat: Compat,
    tenant_annotations: dict[str, str],
    tenant_namespace: str,
    tenant_memory: int,
    pod_annotations: dict[str, str],
    expected: str,
) -> None:
    cards = gpus(16000, 16000)
    book(
        cards,
        "GPU-0",
        tenant_memory,
        10 if tenant_memory else 0,
        compat=compat,
        annotations=tenant_annotations,
        namespace=tenant_namespace,
    )
    result = fit(cards, {NUM: "1", MEM: "100"}, policy="binpack", compat=compat, annotations=pod_annotations)
    assert chosen(result) == [[expected]]


RULES = [{"gpu-exclusive": "a"}, {"team": "x"}]


@pytest.mark.parametrize("compat", BOTH)
@pytest.mark.parametrize(
    ("tenant_labels", "pod_labels", "expected"),
    [
        ({"gpu-exclusive": "a"}, {"gpu-exclusive": "a"}, "GPU-1"),
        ({"gpu-exclusive": "a"}, {"team": "x"}, "GPU-0"),  # another rule
        ({"gpu-exclusive": "a"}, {}, "GPU-0"),  # no rule
        ({}, {"gpu-exclusive": "a"}, "GPU-0"),
        ({"gpu-exclusive": "a", "team": "x"}, {"team": "x", "other": "1"}, "GPU-1"),
        ({"gpu-exclusive": "b"}, {"gpu-exclusive": "a"}, "GPU-0"),
    ],
)
def test_gpu_exclusive_rules(
    compat: Compat, tenant_labels: dict[str, str], pod_labels: dict[str, str], expected: str
) -> None:
    cards = gpus(16000, 16000)
    book(cards, "GPU-0", 1000, compat=compat, labels=tenant_labels)
    result = fit(
        cards, {NUM: "1", MEM: "100"}, policy="binpack", compat=compat, labels=pod_labels, rules=RULES
    )
    assert chosen(result) == [[expected]]
    if expected == "GPU-1":
        cards[1].health = False
        blocked = fit(cards, {NUM: "1", MEM: "100"}, policy="binpack", labels=pod_labels, rules=RULES)
        assert "holds a pod of the same GPU exclusivity rule" in blocked.reason


# --- never mutates, nothing to roll back -----------------------------------------------------


@pytest.mark.parametrize("compat", BOTH)
def test_inputs_unchanged_after_success_and_failure(compat: Compat) -> None:
    cards = gpus(16000, 16000)
    book(cards, "GPU-0", 4000, 20, compat=compat)
    before = copy.deepcopy(cards)
    ok = fit(cards, {NUM: "1", MEM: "1000"}, {NUM: "2", MEM: "1000"}, policy="binpack", compat=compat)
    assert ok.ok
    assert cards == before
    # first container fits, second does not: the first one's tentative usage must not leak
    failed = fit(cards, {NUM: "1", MEM: "1000"}, {NUM: "1", MEM: "15001"}, policy="spread", compat=compat)
    assert not failed.ok
    assert failed.devices == ()
    assert cards == before
    assert fit(cards, {NUM: "1", MEM: "1000"}, policy="binpack", compat=compat) == fit(
        cards, {NUM: "1", MEM: "1000"}, policy="binpack", compat=compat
    )


def test_pod_without_requests_fits_nowhere_in_particular() -> None:
    assert fit_vgpu(gpus(1000), [], pod("p", [container("c", {"cpu": "1"})])) == FitResult(ok=True)


def test_reason_names_pod_container_request_and_each_card() -> None:
    cards = gpus(8000, 8000)
    cards[0].health = False
    book(cards, "GPU-1", 7000)
    result = fit(cards, {NUM: "1", MEM: "2000", CORES: "10"})
    assert not result.ok
    assert result.reason.startswith(
        "pod default/new container 'c0' (1 GPU(s) of 2000 MiB and 10 cores): only 0 of 1 GPU(s) fit"
    )
    assert "GPU 1 (GPU-1): 1000 of 8000 MiB free, needs 2000" in result.reason
    assert "GPU 0 (GPU-0): unhealthy" in result.reason


@pytest.mark.parametrize("compat", BOTH)
def test_empty_exclusive_rule_matches_nothing(compat: Compat) -> None:
    # Volcano drops a rule with no labels when it reads its arguments; it must not make every
    # pod exclusive to every other.
    cards = gpus(16000, 16000)
    book(cards, "GPU-0", 1000, compat=compat, labels={"team": "x"})
    request = {NUM: "1", MEM: "100"}
    result = fit(cards, request, policy="binpack", compat=compat, labels={"a": "b"}, rules=[{}])
    assert chosen(result) == [["GPU-0"]]
