"""compat="volcano" against a transcription of Volcano's Go device code, on random cases.

`volcano_go` is written from the Go source (not from the library or the reference notes); each
test draws thousands of nodes, booked pods and new pods, malformed values included, and requires
the library and the transcription to agree on every decision: which pods are booked, what each
card holds after pods come and go, whether a pod fits, the devices and their annotation values,
the card score and the node score, and where Go would panic, a clear error. The generators only
skip what Go leaves to random map order (a device that two registered UUIDs both match).
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from deviceplugin.fit import (
    Assigned,
    FitInputError,
    FitResult,
    MigGeometry,
    MigGroup,
    MigInstance,
    VgpuConfig,
    add_vgpu_pod,
    fit_gpushare,
    fit_vgpu,
    gpushare_cards,
    has_vgpu_request,
    parse_vgpu_requests,
    remove_vgpu_pod,
    vgpu_bind_annotations,
    vgpu_gpus,
)
from deviceplugin.fit.model import GpuState
from deviceplugin.fit.vgpu import node_score
from tests.fit import volcano_go as go

SEEDS = range(24)
CASES_PER_SEED = 300

# --- shared pieces ----------------------------------------------------------------------------

PHASES = ["Running"] * 6 + ["Pending", "Succeeded", "Failed", "Unknown", ""]

# Numbers no Go writer produces, which Go still reads (clamping, or an error and its fallback):
# past Python's 4,300-digit int() limit, past int64 with a non-digit after the overflow (a range
# error in Go, not a syntax error), and leading zeros that make a short number long.
LONG = "9" * 4400
OVERFLOW_THEN_JUNK = "9" * 20 + "x"
PADDED = "0" * 30
# Quantities as long as the API server writes, whose digits or exponent pass int64.
LONG_QUANTITIES = ["9" * 25, "0" * 40 + "1000", "1e400", "1e-400", "123456789012345678901234567890e-20"]
LONG_QUANTITIES += ["0." + "0" * 50 + "1"]


def _meta(rng: random.Random, name: str, notes: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": notes}
    if rng.random() < 0.15:
        meta["deletionTimestamp"] = "2026-11-25T08:00:00Z"
    return meta


def _pod(rng: random.Random, name: str, notes: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": _meta(rng, name, notes),
        "spec": {"nodeName": "n1", **spec},
        "status": {"phase": rng.choice(PHASES)},
    }


def _resources(rng: random.Random, values: dict[str, str | None]) -> dict[str, Any]:
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    for name, value in values.items():
        if value is None:
            continue
        (requests if rng.random() < 0.1 else limits)[name] = value
    return {"limits": limits, "requests": requests}


# --- gpushare ---------------------------------------------------------------------------------

SHARE_MEMORY = ["1", "1000", "2000", "4000", "8000", "16000", "0", "1500m", "2000m", "1.5", "-1", "3Gi"]
SHARE_MEMORY += ["1e19", *LONG_QUANTITIES]  # past int64: Value() is capped
SHARE_NUMBER = ["1", "2", "0", "3", "-1", "1500m", "9" * 25, PADDED + "2"]
GPU_INDEX = ["0", "1", "2", "0,1", "1,3", "x", "0,x", "7", "-1", " 1", LONG, f"0,{LONG}", "-" + LONG]
GPU_INDEX += [PADDED + "1", f"{PADDED}2,1", OVERFLOW_THEN_JUNK]


def _share_container(rng: random.Random, name: str) -> dict[str, Any]:
    values = {
        go.GPU_MEMORY: rng.choice([*SHARE_MEMORY, None, None]),
        go.GPU_NUMBER: rng.choice([*SHARE_NUMBER, None, None, None]),
    }
    return {"name": name, "resources": _resources(rng, values)}


def _share_pod(rng: random.Random, name: str, placed: bool) -> dict[str, Any]:
    notes: dict[str, str] = {}
    if placed:
        notes["volcano.sh/gpu-index"] = rng.choice(GPU_INDEX)
    spec: dict[str, Any] = {"containers": [_share_container(rng, f"c{k}") for k in range(rng.randint(1, 3))]}
    if rng.random() < 0.3:
        spec["initContainers"] = [_share_container(rng, "init")]
    return _pod(rng, name, notes, spec)


def _share_node(rng: random.Random) -> dict[str, Any]:
    number = rng.choice(["4", "4", "2", "1", "3", "0"])
    memory = rng.choice(["64000", "65536", "32000", "16000", "7", "0", "1e30", "9" * 30, PADDED + "64000"])
    notes = {}
    if rng.random() < 0.4:
        notes["volcano.sh/gpu-unhealthy-ids"] = rng.choice(
            ["1", "0,3", "x,2", "9", "", "2,2", f"{LONG},1", PADDED + "2", f"{OVERFLOW_THEN_JUNK},3"]
        )
    capacity = {go.GPU_MEMORY: memory, go.GPU_NUMBER: number}
    if rng.random() < 0.05:
        del capacity[rng.choice(list(capacity))]
    return {"metadata": {"name": "n1", "annotations": notes}, "status": {"capacity": capacity}}


def _check_share_case(rng: random.Random) -> None:
    node = _share_node(rng)
    pods = [_share_pod(rng, f"p{k}", placed=True) for k in range(rng.randint(0, 5))]
    pod = _share_pod(rng, "new", placed=False)
    strategy = rng.choice(["share", "number"])
    devices = go.share_devices(node)
    if devices is not None:
        for p in pods:
            if go.cache_books_devices(p):
                go.share_add_resource(devices, p)
    expected = go.share_schedule(devices, pod, strategy == "share")
    cards = gpushare_cards(node, pods, "volcano")
    if devices is None:
        assert cards == []
        return
    assert sorted(c.index for c in cards if c.health) == sorted(d for d in devices if d < len(cards))
    result = fit_gpushare(cards, pod, strategy=strategy, compat="volcano", rng=random.Random(7))  # type: ignore[arg-type]
    assert result.ok is expected.fits, result.reason
    if not result.ok:
        return
    chosen = [d.index for devs in result.devices for d in devs]
    if expected.cards is not None:
        assert chosen == expected.cards
    else:
        assert len(chosen) == expected.count and set(chosen) <= set(expected.idle)


@pytest.mark.parametrize("seed", SEEDS)
def test_gpushare_agrees_with_volcano(seed: int) -> None:
    rng = random.Random(seed)
    for case in range(CASES_PER_SEED):
        state = rng.getstate()
        try:
            _check_share_case(rng)
        except AssertionError as err:
            rng.setstate(state)
            raise AssertionError(f"seed {seed} case {case}: {err}") from None


# --- vGPU -------------------------------------------------------------------------------------

PERCENTAGE = "volcano.sh/vgpu-memory-percentage"
TYPES = ["NVIDIA-A100-SXM4-40GB", "NVIDIA-Tesla T4", "NVIDIA-H100 80GB HBM3", "AMD-MI300"]
INSTANCES = [("1g.5gb", 4864), ("1g.10gb", 9856), ("2g.10gb", 10240), ("3g.20gb", 20480), ("7g.40gb", 40960)]


def _geometries(rng: random.Random) -> list[tuple[list[str], list[go.Geometry]]]:
    result = []
    for models in (["A100"], ["H100", "T4"]):
        if rng.random() < 0.3:
            continue
        groups = []
        for g in range(rng.randint(1, 2)):
            picks = rng.sample(INSTANCES, rng.randint(1, 3))
            groups.append(go.Geometry(f"group{g}", [(n, m, rng.randint(1, 4)) for n, m in picks]))
        result.append((models, groups))
    return result


def _lib_config(pct: str, factor: int, geos: list[tuple[list[str], list[go.Geometry]]]) -> VgpuConfig:
    mig = tuple(
        MigGeometry(
            models=tuple(models),
            groups=tuple(
                MigGroup(g.group, tuple(MigInstance(n, m, c) for n, m, c in g.instances)) for g in groups
            ),
        )
        for models, groups in geos
    )
    return VgpuConfig(percentage_resource=pct, memory_factor=factor, mig_geometries=mig)


def _register(rng: random.Random, uuids: list[str]) -> str:
    mode = rng.choice(["hami-core"] * 3 + ["mig"] * 3 + ["mps", ""])
    pieces = []
    for uuid in uuids:
        fields = [
            uuid,
            rng.choice(["10"] * 6 + ["4", "1", "0", "-1", "x", LONG, PADDED + "4", OVERFLOW_THEN_JUNK]),
            rng.choice(
                ["40960", "16384", "81920"] * 4
                + ["1000", "0", "-5", "abc", LONG, PADDED + "40960", "-" + LONG, OVERFLOW_THEN_JUNK]
            ),
            rng.choice(TYPES),
            rng.choice(["true"] * 6 + ["false", "1", "nope"]),
            mode if rng.random() < 0.9 else rng.choice(["hami-core", "mig"]),
        ]
        if rng.random() < 0.03:
            fields = fields[:5]
        pieces.append(",".join(fields))
    if rng.random() < 0.08:
        pieces.insert(rng.randint(0, len(pieces)), "")  # an empty entry: a gap in Go's map keys
    return ":".join(pieces) + (":" if rng.random() < 0.9 else "")


def _vgpu_node(rng: random.Random, uuids: list[str]) -> dict[str, Any]:
    allocatable = {go.VGPU_NUMBER: "40", go.VGPU_CORES: "400", go.VGPU_MEMORY: "65536"}
    if rng.random() < 0.05:
        allocatable[rng.choice(list(allocatable))] = "0"
    return {
        "metadata": {"name": "n1", "annotations": {"volcano.sh/node-vgpu-register": _register(rng, uuids)}},
        "status": {"allocatable": allocatable},
    }


def _device_id(rng: random.Random, uuid: str, geos: list[tuple[list[str], list[go.Geometry]]]) -> str:
    if rng.random() < 0.5:
        return uuid
    groups = [g for _, gs in geos for g in gs]
    name = rng.choice(groups).group if groups and rng.random() < 0.9 else "nogroup"
    position = rng.choice(["0", "1", "2", "3", "5", "-1", "x", LONG, PADDED + "1", OVERFLOW_THEN_JUNK])
    slot = f"{name}-{position}"
    # Go reads between the first '[' and the first ']'; odd shapes must read the same here.
    odd = [f"{uuid}[{slot}]]", f"{uuid}[{slot}][g-9]", f"{uuid}][{slot}]", f"[{slot}]{uuid}"]
    odd.append(f"{slot}]{uuid}")
    shapes = [f"{uuid}[{slot}]"] * 6 + odd
    return rng.choice(shapes)


BOOKED_MEMORY = ["1000", "4000", "0", "20000", "-3", "5000000000", "4294967295", LONG, OVERFLOW_THEN_JUNK]
BOOKED_MEMORY += [PADDED + "1000"]


def _booked_pod(rng: random.Random, name: str, uuids: list[str], geos: Any) -> dict[str, Any]:
    containers = []
    for _ in range(rng.randint(1, 2)):
        entries = []
        for _ in range(rng.randint(1, 2)):
            memory = rng.choice(BOOKED_MEMORY)
            cores = rng.choice(["0", "10", "50", "100", "4294967295", LONG, PADDED + "10"])
            entries.append(f"{_device_id(rng, rng.choice(uuids), geos)},NVIDIA,{memory},{cores}:")
        containers.append("".join(entries))
    notes = {"volcano.sh/vgpu-ids-new": ";".join(containers)}
    if rng.random() < 0.4:
        notes["scheduling.k8s.io/group-name"] = rng.choice(["g1", "g2"])
    return _pod(rng, name, notes, {"containers": [{"name": "main"}]})


def _vgpu_container(rng: random.Random, name: str) -> dict[str, Any]:
    values = {
        go.VGPU_NUMBER: rng.choice(["1"] * 6 + ["2", "2", "0", "-1", "3Gi", "1.0", None, None, None]),
        go.VGPU_MEMORY: rng.choice(
            ["1024", "2000", "10000", "10240", "4864", "20480"] * 2
            + ["0", "2000m", "3Gi", "-1", "1000000000000002000", "1Pi", *LONG_QUANTITIES]
            + [None] * 6
        ),
        PERCENTAGE: rng.choice(["50", "100", "0", "101", "150", "1.5", "-20", None, None, None, None]),
        go.VGPU_CORES: rng.choice(
            ["0", "30", "50"] * 3
            + ["100", "101", "3Gi", "-1", "1000000000000000001", *LONG_QUANTITIES]
            + [None] * 6
        ),
    }
    return {"name": name, "resources": _resources(rng, values)}


def _new_vgpu_pod(rng: random.Random, uuids: list[str]) -> dict[str, Any]:
    notes: dict[str, str] = {}
    if rng.random() < 0.15:
        notes["volcano.sh/vgpu-mode"] = rng.choice(["hami-core", "mig", "mps"])
    if rng.random() < 0.15:
        notes["nvidia.com/use-gputype"] = rng.choice(["A100", "t4,h100", "a100,", "V100"])
    elif rng.random() < 0.1:
        notes["nvidia.com/nouse-gputype"] = rng.choice(["A100", "T4,V100"])
    if rng.random() < 0.1:
        notes["volcano.sh/vgpu-use-gpuuuid"] = ",".join(rng.sample(uuids, 1)) + rng.choice(["", ", GPU-none"])
    if rng.random() < 0.1:
        notes["volcano.sh/vgpu-nouse-gpuuuid"] = rng.choice(uuids)
    if rng.random() < 0.2:
        notes["volcano.sh/vgpu-podgroup-policy"] = "spread"
        notes["scheduling.volcano.sh/group-name"] = rng.choice(["g1", "g2"])
    spec = {"containers": [_vgpu_container(rng, f"c{k}") for k in range(rng.randint(1, 3))]}
    return _pod(rng, "new", notes, spec)


def _counters(gpus: list[GpuState]) -> dict[int, tuple[int, int, int]]:
    return {g.index: (g.used_num % go.U64, g.used_memory % go.U64, g.used_cores % go.U64) for g in gpus}


def _go_counters(node: go.VNode) -> dict[int, tuple[int, int, int]]:
    return {i: (d.used_num, d.used_mem, d.used_core) for i, d in node.devices.items()}


def _mig_state(gpus: list[GpuState], node: go.VNode) -> dict[int, tuple[int, dict[str, list[int]]]]:
    """MIG slots per card; only a node whose mode is `mig` uses them."""
    if node.mode != "mig":
        return {}
    return {
        g.index: (g.mig.active, {k: sorted(v) for k, v in g.mig.used.items() if v}) for g in gpus if g.mig
    }


def _go_mig_state(node: go.VNode) -> dict[int, tuple[int, dict[str, list[int]]]]:
    return {
        i: (d.mig_index, {m.name: sorted(m.used_index) for m in d.mig_usage if m.used_index})
        for i, d in node.devices.items()
        if d.mig_template and node.mode == "mig"
    }


def _same_score(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _check_vgpu_case(rng: random.Random) -> None:
    uuids = [f"GPU-{rng.randrange(16**8):08x}" for _ in range(rng.randint(1, 4))]
    if len(set(uuids)) != len(uuids):
        return
    geos = _geometries(rng)
    pct = rng.choice(["", PERCENTAGE])
    factor = rng.choice([1, 1, 1, 2, 1024])
    config, go_config = _lib_config(pct, factor, geos), go.VConfig(pct, factor, geos)
    node = _vgpu_node(rng, uuids)
    pods = [_booked_pod(rng, f"p{k}", uuids, geos) for k in range(rng.randint(0, 4))]
    pod = _new_vgpu_pod(rng, uuids)
    policy = rng.choice(["", "binpack", "spread", "other"])

    go_node = go.vgpu_node(node, go_config)
    try:
        if go_node is not None:
            for p in pods:
                if go.cache_books_devices(p):
                    go.vgpu_add_resource(go_node, p, go_config)
    except go.GoPanic:
        with pytest.raises(FitInputError, match="panics"):
            vgpu_gpus(node, pods, config=config, compat="volcano")
        return
    gpus = vgpu_gpus(node, pods, config=config, compat="volcano")
    if go_node is None:
        assert gpus == []
        return
    assert _counters(gpus) == _go_counters(go_node)
    assert _mig_state(gpus, go_node) == _go_mig_state(go_node)
    booked = [p for p in pods if go.cache_books_devices(p)]
    if booked and rng.random() < 0.5:
        leaving = rng.choice(booked)
        try:
            go.vgpu_sub_resource(go_node, leaving, go_config)
        except go.GoPanic:
            with pytest.raises(FitInputError, match="panics"):
                remove_vgpu_pod(gpus, leaving["metadata"]["uid"], "volcano", config=config)
            return
        remove_vgpu_pod(gpus, leaving["metadata"]["uid"], "volcano", config=config)
        assert _counters(gpus) == _go_counters(go_node)
        assert _mig_state(gpus, go_node) == _go_mig_state(go_node)

    assert has_vgpu_request(pod, config, "volcano") is go.has_vgpu_request(pod)
    if not go.has_vgpu_request(pod):
        return
    requests = parse_vgpu_requests(pod, config, "volcano")
    try:
        expected = go.vgpu_fit(go_node, pod, policy, go_config)
    except go.GoPanic:
        with pytest.raises(FitInputError, match="panics"):
            fit_vgpu(gpus, requests, pod, policy, "volcano", config=config)
        return
    result = fit_vgpu(gpus, requests, pod, policy, "volcano", config=config)
    assert result.ok is expected.fits, result.reason
    if not result.ok:
        return
    devices = [[(d.uuid, d.type, d.memory, d.cores) for d in devs] for devs in result.devices]
    assert devices == expected.devices
    assert _same_score(result.score, expected.score)
    weight = rng.randint(1, 3)
    assert _same_score(node_score(result.score, weight), go.node_score(expected.score, weight))


@pytest.mark.parametrize("seed", SEEDS)
def test_vgpu_agrees_with_volcano(seed: int) -> None:
    rng = random.Random(seed)
    for case in range(CASES_PER_SEED):
        try:
            _check_vgpu_case(rng)
        except AssertionError as err:
            raise AssertionError(f"seed {seed} case {case}: {err}") from None


# --- the divergences issue 12 named, as examples ----------------------------------------------


def test_mig_card_without_uuid_formats_like_go() -> None:
    node = {
        "metadata": {
            "annotations": {"volcano.sh/node-vgpu-register": ",10,40960,NVIDIA-A100-SXM4-40GB,true,mig:"}
        },
        "status": {"allocatable": {go.VGPU_NUMBER: "10", go.VGPU_CORES: "100", go.VGPU_MEMORY: "40960"}},
    }
    config = _lib_config("", 1, [(["A100"], [go.Geometry("g", [("1g.10gb", 10240, 4)])])])
    pod = {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {
            "containers": [
                {"name": "c", "resources": {"limits": {go.VGPU_NUMBER: "1", go.VGPU_MEMORY: "1000"}}}
            ]
        },
    }
    gpus = vgpu_gpus(node, [], config=config, compat="volcano")
    result = fit_vgpu(gpus, parse_vgpu_requests(pod, config, "volcano"), pod, None, "volcano", config=config)
    assert result.ok and result.devices[0][0].uuid == "[g-0]"


def test_register_gap_under_unset_policy_is_a_clear_error() -> None:
    node = {
        "metadata": {
            "annotations": {
                "volcano.sh/node-vgpu-register": "GPU-a,10,1000,NVIDIA,true,hami-core:"
                ":GPU-b,10,1000,NVIDIA,true,hami-core:"
            }
        },
        "status": {"allocatable": {go.VGPU_NUMBER: "10", go.VGPU_CORES: "100", go.VGPU_MEMORY: "2000"}},
    }
    pod = {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {go.VGPU_NUMBER: "1"}}}]},
    }
    gpus = vgpu_gpus(node, [], compat="volcano")
    requests = parse_vgpu_requests(pod, compat="volcano")
    with pytest.raises(FitInputError, match="panics"):
        fit_vgpu(gpus, requests, pod, None, "volcano")
    assert fit_vgpu(gpus, requests, pod, "binpack", "volcano").ok  # binpack walks the real keys


def test_cores_that_wrap_negative_never_fit_but_memory_that_wraps_does() -> None:
    node = {
        "metadata": {
            "annotations": {"volcano.sh/node-vgpu-register": "GPU-a,10,1000,NVIDIA,true,hami-core:"}
        },
        "status": {"allocatable": {go.VGPU_NUMBER: "10", go.VGPU_CORES: "100", go.VGPU_MEMORY: "1000"}},
    }
    gpus = vgpu_gpus(node, [], compat="volcano")

    def fit(limits: dict[str, str]) -> Any:
        pod = {
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
        }
        return fit_vgpu(gpus, parse_vgpu_requests(pod, compat="volcano"), pod, "binpack", "volcano")

    # int32(3Gi) < 0; uint(that) + used cores > 100 in Go's unsigned arithmetic.
    assert not fit({go.VGPU_NUMBER: "1", go.VGPU_CORES: "3Gi"}).ok
    wrapped = fit({go.VGPU_NUMBER: "1", go.VGPU_MEMORY: "3Gi"})
    assert wrapped.ok and wrapped.devices[0][0].memory == -(2**30)  # Go writes int(uint(int32(3Gi)))
    notes = vgpu_bind_annotations(wrapped, "n1", 0, "volcano")
    assert notes["volcano.sh/vgpu-ids-new"] == "GPU-a,NVIDIA,-1073741824,0:"
    two = fit({go.VGPU_NUMBER: "1", go.VGPU_MEMORY: "3Gi"})
    both = FitResult(ok=True, devices=(two.devices[0], (), two.devices[0] * 2))
    assert vgpu_bind_annotations(both, "n1", 0, "volcano")["volcano.sh/devices-to-allocate"] == (
        "GPU-a,NVIDIA,-1073741824,0:;;GPU-a,NVIDIA,-1073741824,0:GPU-a,NVIDIA,-1073741824,0:"
    )
    assert wrapped.score == 100 * (float(2**64 - 2**30) / 1000)  # float64 of the wrapped uint counter


def test_mig_release_repins_and_returns_the_instance_memory() -> None:
    geometry = [
        (["A100"], [go.Geometry("g0", [("1g.10gb", 10240, 2)]), go.Geometry("g1", [("3g.20gb", 20480, 2)])])
    ]
    config = _lib_config("", 1, geometry)
    node = {
        "metadata": {
            "annotations": {"volcano.sh/node-vgpu-register": "GPU-a,10,40960,NVIDIA-A100,true,mig:"}
        },
        "status": {"allocatable": {go.VGPU_NUMBER: "10", go.VGPU_CORES: "100", go.VGPU_MEMORY: "40960"}},
    }
    holder = {
        "metadata": {
            "name": "h",
            "uid": "h",
            "annotations": {"volcano.sh/vgpu-ids-new": "GPU-a[g1-0],NVIDIA,20000,0:"},
        },
        "status": {"phase": "Running"},
    }
    gpus = vgpu_gpus(node, [holder], config=config, compat="volcano")
    assert gpus[0].mig is not None and gpus[0].mig.active == 1 and gpus[0].used_memory == 20480
    remove_vgpu_pod(gpus, "h", "volcano", config=config)
    assert (gpus[0].mig.active, gpus[0].used_memory, gpus[0].mig.used) == (1, 0, {})
    # Still pinned to g1 although idle: a 1g request finds no 1g.10gb slot there.
    pod = {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {
            "containers": [
                {"name": "c", "resources": {"limits": {go.VGPU_NUMBER: "1", go.VGPU_MEMORY: "5000"}}}
            ]
        },
    }
    result = fit_vgpu(gpus, parse_vgpu_requests(pod, config, "volcano"), pod, None, "volcano", config=config)
    assert result.ok and result.devices[0][0].uuid == "GPU-a[g1-0]"


def test_gpu_number_node_places_a_memory_pod_by_memory() -> None:
    node = {"metadata": {"name": "n"}, "status": {"capacity": {go.GPU_MEMORY: "32000", go.GPU_NUMBER: "2"}}}
    busy = {
        "metadata": {"name": "b", "uid": "b", "annotations": {"volcano.sh/gpu-index": "0"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {go.GPU_MEMORY: "4000"}}}]},
        "status": {"phase": "Running"},
    }
    cards = gpushare_cards(node, [busy], "volcano")

    def pod(memory: str) -> dict[str, Any]:
        limits = {go.GPU_NUMBER: "1", go.GPU_MEMORY: memory}
        return {
            "metadata": {"name": "p", "uid": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
        }

    # The filter only counts idle cards (GPU 1); Allocate then takes the memory branch: GPU 0,
    # shared, because it is the lowest index with 12000 MiB free.
    fits = fit_gpushare(cards, pod("12000"), strategy="number", compat="volcano")
    assert fits.ok and fits.devices == ((Assigned(cards[0].uuid, 0, cards[0].type, 12000, 0),),)
    # Nothing has 16001 MiB free: Volcano's filter passes but Allocate fails, so it is not placed.
    refused = fit_gpushare(cards, pod("16001"), strategy="number", compat="volcano")
    assert not refused.ok and "places it by memory" in refused.reason and "16001" in refused.reason


def test_booking_follows_volcanos_cache() -> None:
    node = {"metadata": {"name": "n"}, "status": {"capacity": {go.GPU_MEMORY: "32000", go.GPU_NUMBER: "2"}}}

    def holder(phase: str, deleting: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "h", "uid": "h", "annotations": {"volcano.sh/gpu-index": "0"}}
        if deleting:
            meta["deletionTimestamp"] = "2026-11-25T08:00:00Z"
        return {
            "metadata": meta,
            "spec": {"containers": [{"name": "c", "resources": {"limits": {go.GPU_MEMORY: "16000"}}}]},
            "status": {"phase": phase},
        }

    for phase, deleting in [
        ("Succeeded", False),
        ("Running", True),
        ("Pending", True),
        ("Unknown", True),
        ("", True),
    ]:
        cards = gpushare_cards(node, [holder(phase, deleting)], "volcano")
        assert bool(cards[0].pods) is go.cache_books_devices(holder(phase, deleting)), (phase, deleting)


def test_add_vgpu_pod_matches_the_transcription_on_repeat_adds() -> None:
    # Adding a booked pod again books nothing more, in both.
    node = {
        "metadata": {
            "annotations": {"volcano.sh/node-vgpu-register": "GPU-a,10,1000,NVIDIA,true,hami-core:"}
        },
        "status": {"allocatable": {go.VGPU_NUMBER: "10", go.VGPU_CORES: "100", go.VGPU_MEMORY: "1000"}},
    }
    holder = {
        "metadata": {
            "name": "h",
            "uid": "h",
            "annotations": {"volcano.sh/vgpu-ids-new": "GPU-a,NVIDIA,300,10:"},
        },
        "status": {"phase": "Running"},
    }
    gpus = vgpu_gpus(node, [holder], compat="volcano")
    add_vgpu_pod(gpus, holder, "volcano")
    go_node = go.vgpu_node(node, go.VConfig())
    assert go_node is not None
    go.vgpu_add_resource(go_node, holder, go.VConfig())
    go.vgpu_add_resource(go_node, holder, go.VConfig())
    assert _counters(gpus) == _go_counters(go_node) == {0: (1, 300, 10)}


def test_releasing_a_slot_whose_usage_entry_is_gone_gives_back_nothing() -> None:
    # Two pods booked on one slot (insert drops the duplicate index): the first release empties and
    # deletes the 1g.10gb usage entry, so the second finds no entry and subMigUsed returns 0.
    config = _lib_config("", 1, [(["A100"], [go.Geometry("g", [("1g.10gb", 10240, 2)])])])
    register = "GPU-a,10,40960,NVIDIA-A100,true,mig:"
    node = {
        "metadata": {"annotations": {"volcano.sh/node-vgpu-register": register}},
        "status": {"allocatable": {go.VGPU_NUMBER: "10", go.VGPU_CORES: "100", go.VGPU_MEMORY: "40960"}},
    }

    def holder(name: str) -> dict[str, Any]:
        notes = {"volcano.sh/vgpu-ids-new": "GPU-a[g-1],NVIDIA,5000,0:"}
        return {"metadata": {"name": name, "uid": name, "annotations": notes}, "status": {"phase": "Running"}}

    gpus = vgpu_gpus(node, [holder("a"), holder("b")], config=config, compat="volcano")
    assert gpus[0].used_memory == 2 * 10240
    remove_vgpu_pod(gpus, "a", "volcano", config=config)
    assert gpus[0].used_memory == 10240
    remove_vgpu_pod(gpus, "b", "volcano", config=config)
    assert (gpus[0].used_num, gpus[0].used_memory) == (0, 10240)  # Go leaks the second booking
