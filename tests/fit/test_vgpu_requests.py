"""vGPU request parsing (semantics reference §3.4; defaults in docs/fit.md)."""

from __future__ import annotations

from typing import Any

import pytest

from deviceplugin.fit import (
    Compat,
    ContainerRequest,
    RequestError,
    VgpuConfig,
    has_vgpu_request,
    parse_vgpu_requests,
)
from tests.fit.builders import CORES, MEM, NUM, PCT, container, pod

WITH_PERCENT = VgpuConfig(percentage_resource=PCT)


def one(limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None) -> dict[str, Any]:
    return pod("p", [container("main", limits, requests)])


def request(nums: int, memory: int = 0, percentage: int | None = None, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(name="main", nums=nums, memory=memory, memory_percentage=percentage, cores=cores)


# (id, limits, requests, config, expected under compat="volcano", expected by default)
CASES: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None, VgpuConfig, Any, Any]] = [
    ("count and memory", {NUM: "2", MEM: "3000"}, None, VgpuConfig(), request(2, 3000), request(2, 3000)),
    ("memory alone is one device", {MEM: "1024"}, None, VgpuConfig(), request(1, 1024), request(1, 1024)),
    ("count alone takes whole cards", {NUM: "1"}, None, VgpuConfig(), request(1, 0, 100), request(1, 0, 100)),
    ("memory from requests", {NUM: "1"}, {MEM: "2048"}, VgpuConfig(), request(1, 2048), request(1, 2048)),
    (
        "limits win over requests",
        {NUM: "1", MEM: "1000"},
        {MEM: "2000"},
        VgpuConfig(),
        request(1, 1000),
        request(1, 1000),
    ),
    (
        "cores from limits",
        {NUM: "1", MEM: "1000", CORES: "30"},
        None,
        VgpuConfig(),
        request(1, 1000, cores=30),
        request(1, 1000, cores=30),
    ),
    (
        "cores from requests",
        {NUM: "1", MEM: "1000"},
        {CORES: "40"},
        VgpuConfig(),
        request(1, 1000, cores=40),
        request(1, 1000, cores=40),
    ),
    ("no vGPU resources", {"cpu": "1"}, None, VgpuConfig(), None, None),
    ("count in requests only is not a request", None, {NUM: "1"}, VgpuConfig(), None, request(1, 0, 100)),
    # B5: Volcano's default config has no percentage resource name.
    (
        "percentage ignored by Volcano's default config",
        {NUM: "1", PCT: "50"},
        None,
        VgpuConfig(),
        request(1, 0, 100),
        request(1, 0, 50),
    ),
    (
        "percentage with a configured name",
        {NUM: "1", PCT: "50"},
        None,
        WITH_PERCENT,
        request(1, 0, 50),
        request(1, 0, 50),
    ),
    ("percentage only, configured", {PCT: "25"}, None, WITH_PERCENT, None, request(1, 0, 25)),
    (
        "percentage off by config",
        {NUM: "1", PCT: "50"},
        None,
        VgpuConfig(percentage_resource=""),
        request(1, 0, 100),
        request(1, 0, 100),
    ),
    # Volcano keeps values the default rejects (B12, B13, B20, AsInt64).
    ("percentage 0 books 0 MiB", {NUM: "1", PCT: "0"}, None, WITH_PERCENT, request(1, 0, 0), RequestError),
    ("percentage over 100", {NUM: "1", PCT: "150"}, None, WITH_PERCENT, request(1, 0, 150), RequestError),
    (
        "percentage 101 is Volcano's unset",
        {NUM: "1", PCT: "101"},
        None,
        WITH_PERCENT,
        request(1, 0, 100),
        RequestError,
    ),
    (
        "percentage and memory both",
        {NUM: "1", MEM: "1000", PCT: "50"},
        None,
        WITH_PERCENT,
        request(1, 1000, 50),
        RequestError,
    ),
    (
        "cores over 100",
        {NUM: "1", MEM: "1000", CORES: "150"},
        None,
        VgpuConfig(),
        request(1, 1000, cores=150),
        RequestError,
    ),
    ("explicit zero count", {NUM: "0", MEM: "1000"}, None, VgpuConfig(), request(0, 1000), RequestError),
    ("explicit zero count alone", {NUM: "0"}, None, VgpuConfig(), request(0, 0, 100), None),
    ("fractional count", {NUM: "1.5", MEM: "1000"}, None, VgpuConfig(), request(0, 1000), RequestError),
    ("fractional memory", {NUM: "1", MEM: "0.5"}, None, VgpuConfig(), request(1, 0, 100), RequestError),
    (
        "16Gi of MiB wraps to 0 in int32",
        {NUM: "1", MEM: "16Gi"},
        None,
        VgpuConfig(),
        request(1, 0, 100),
        request(1, 16 * 2**30),
    ),
    ("cores without count or memory", {CORES: "50"}, None, VgpuConfig(), None, RequestError),
    (
        "zero memory takes the whole card",
        {NUM: "1", MEM: "0"},
        None,
        VgpuConfig(),
        request(1, 0, 100),
        request(1, 0, 100),
    ),
    ("JSON numbers", {NUM: 1, MEM: 2048}, None, VgpuConfig(), request(1, 2048), request(1, 2048)),
    (
        "custom resource names",
        {"acme/gpu": "1", "acme/mem": "512"},
        None,
        VgpuConfig(count_resource="acme/gpu", memory_resource="acme/mem"),
        request(1, 512),
        request(1, 512),
    ),
]


@pytest.mark.parametrize("compat", [None, "volcano"])
@pytest.mark.parametrize(
    ("limits", "requests", "config", "volcano", "default"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_container_request(
    compat: Compat,
    limits: dict[str, Any] | None,
    requests: dict[str, Any] | None,
    config: VgpuConfig,
    volcano: Any,
    default: Any,
) -> None:
    expected = volcano if compat else default
    if expected is RequestError:
        with pytest.raises(RequestError, match=r"pod default/p container 'main'"):
            parse_vgpu_requests(one(limits, requests), config, compat)
        return
    got = parse_vgpu_requests(one(limits, requests), config, compat)
    assert got == ([] if expected is None else [expected])


def test_only_requesting_app_containers_in_order() -> None:
    p = pod(
        "p",
        [
            container("a", {NUM: "1", MEM: "100"}),
            container("sidecar", {"cpu": "1"}),
            container("b", {MEM: "200"}),
        ],
    )
    for compat in (None, "volcano"):
        got = parse_vgpu_requests(p, compat=compat)
        assert [(r.name, r.nums, r.memory) for r in got] == [("a", 1, 100), ("b", 1, 200)]


def test_init_containers_ignored_by_volcano_rejected_by_default() -> None:
    p = pod("p", [container("app", {NUM: "1", MEM: "100"})], init_containers=[container("init", {NUM: "1"})])
    assert [r.name for r in parse_vgpu_requests(p, compat="volcano")] == ["app"]
    with pytest.raises(RequestError, match=r"init container 'init'.*app containers only"):
        parse_vgpu_requests(p)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({NUM: "-1"}, r"volcano.sh/vgpu-number must be a non-negative whole number"),
        ({NUM: "1", MEM: "abc"}, r"volcano.sh/vgpu-memory: quantity 'abc' is not a Kubernetes quantity"),
        ({NUM: "1", CORES: "101"}, r"volcano.sh/vgpu-cores is 101; a GPU has 100"),
        ({NUM: "1", MEM: "5", PCT: "5"}, r"give volcano.sh/vgpu-memory or volcano.sh/vgpu-memory-percentage"),
        ({PCT: "0"}, r"volcano.sh/vgpu-memory-percentage must be 1..100, not 0"),
        ({NUM: True}, r"is a boolean"),
    ],
)
def test_default_errors_say_what_is_wrong(limits: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_vgpu_requests(one(limits))


@pytest.mark.parametrize(
    ("limits", "requests", "volcano", "default"),
    [
        ({NUM: "1"}, None, True, True),
        ({MEM: "1"}, None, True, True),
        ({PCT: "10"}, None, False, True),
        ({CORES: "10"}, None, False, False),
        (None, {NUM: "1", MEM: "1"}, False, False),
        ({"nvidia.com/gpu": "1"}, None, False, False),
    ],
)
def test_has_vgpu_request(
    limits: dict[str, Any] | None, requests: dict[str, Any] | None, volcano: bool, default: bool
) -> None:
    p = one(limits, requests)
    assert has_vgpu_request(p, compat="volcano") is volcano
    assert has_vgpu_request(p) is default
