"""Annotation codecs: pod devices, node registration, GPU index lists and MIG device IDs.

Expectations come from the shared reference ``volcano-fit-semantics.md``: section 2 (pod devices,
Volcano and HAMi dialects), 3.2 (`volcano.sh/node-vgpu-register`, current 6-field and legacy
5-field entries, and how Volcano reads short entries, bad numbers and bools), 1.1 and 1.3
(`gpu-unhealthy-ids`, `gpu-index`) and 3.8 (MIG IDs `UUID[group-position]`). docs/fit.md says how
the strict default differs from `compat="volcano"`, which reproduces Volcano's lenient reading.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from deviceplugin.fit import (
    AnnotationError,
    Assigned,
    ConfigError,
    FitInputError,
    GpuIndexError,
    GpuState,
    NodeRegisterError,
    PodDevicesError,
    decode_mig_id,
    decode_node_register,
    decode_pod_devices,
    encode_mig_id,
    encode_node_register,
    encode_pod_devices,
    format_gpu_index,
    parse_gpu_index,
    parse_unhealthy_ids,
    physical_uuid,
)

Containers = list[list[Assigned]]

V100 = "NVIDIA-Tesla V100-PCIE-32GB"


def dev(uuid: str, memory: int, cores: int, kind: str = "NVIDIA", index: int | None = None) -> Assigned:
    """One device entry of a pod devices value."""
    return Assigned(uuid=uuid, index=index, type=kind, memory=memory, cores=cores)


def card(
    index: int,
    uuid: str,
    *,
    count: int = 10,
    memory: int = 32768,
    kind: str = V100,
    health: bool = True,
    mode: str = "hami-core",
) -> GpuState:
    """A registered GPU as `decode_node_register` returns it (no usage)."""
    return GpuState(
        index=index, uuid=uuid, type=kind, memory=memory, split_count=count, health=health, mode=mode
    )


def entry(uuid: str = "GPU-0", count: str = "10", memory: str = "100", health: str = "true") -> str:
    """One 6-field registration entry with the given raw pieces (type `T`, mode hami-core)."""
    return f"{uuid},{count},{memory},T,{health},hami-core:"


def test_error_classes_are_value_errors() -> None:
    for error in (PodDevicesError, NodeRegisterError, GpuIndexError):
        assert issubclass(error, AnnotationError)
        assert issubclass(error, FitInputError)
        assert issubclass(error, ValueError)


# --- pod devices: encoding -------------------------------------------------------------------

A = dev("A", 3000, 25)
B = dev("B", 3000, 25)
B_SMALL = dev("B", 1000, 0)
A_HAMI = dev("A", 500, 3)
B_HAMI = dev("B", 500, 3)
MIG = dev("GPU-1f3e[config-a-3]", 20480, 0)


@pytest.mark.parametrize(
    ("containers", "dialect", "expected"),
    [
        pytest.param([[A, B]], "volcano", "A,NVIDIA,3000,25:B,NVIDIA,3000,25:", id="volcano-one-container"),
        pytest.param([[A], [B_SMALL]], "volcano", "A,NVIDIA,3000,25:;B,NVIDIA,1000,0:", id="volcano-two"),
        pytest.param(
            [[A], [], [B]], "volcano", "A,NVIDIA,3000,25:;;B,NVIDIA,3000,25:", id="volcano-empty-mid"
        ),
        pytest.param([], "volcano", "", id="volcano-no-containers"),
        pytest.param([[MIG]], "volcano", "GPU-1f3e[config-a-3],NVIDIA,20480,0:", id="volcano-mig-id"),
        pytest.param([[A_HAMI]], "hami", "A,NVIDIA,500,3:;", id="hami-one-container"),
        pytest.param(
            [[A_HAMI], [], [B_HAMI]], "hami", "A,NVIDIA,500,3:;;B,NVIDIA,500,3:;", id="hami-empty-mid"
        ),
        pytest.param([[], [A_HAMI]], "hami", ";A,NVIDIA,500,3:;", id="hami-empty-first"),
        pytest.param([[]], "hami", ";", id="hami-only-empty"),
        pytest.param([], "hami", "", id="hami-no-containers"),
    ],
)
def test_encode_pod_devices(containers: Containers, dialect: Any, expected: str) -> None:
    assert encode_pod_devices(containers, dialect) == expected


def test_encode_pod_devices_defaults_to_volcano_dialect() -> None:
    assert encode_pod_devices([[A], [B_SMALL]]) == "A,NVIDIA,3000,25:;B,NVIDIA,1000,0:"


def test_encode_pod_devices_ignores_card_index() -> None:
    with_index = [[dev("A", 3000, 25, index=4)]]
    assert encode_pod_devices(with_index) == encode_pod_devices([[A]])


def test_encode_pod_devices_accepts_generators() -> None:
    assert encode_pod_devices(iter([iter([A]), iter([B_SMALL])])) == "A,NVIDIA,3000,25:;B,NVIDIA,1000,0:"


@pytest.mark.parametrize(
    "device",
    [
        pytest.param(dev("A,x", 1, 0), id="uuid-with-comma"),
        pytest.param(dev("A:x", 1, 0), id="uuid-with-colon"),
        pytest.param(dev("A;x", 1, 0), id="uuid-with-semicolon"),
        pytest.param(dev("", 1, 0), id="empty-uuid"),
        pytest.param(dev("A", 1, 0, kind="NVI,DIA"), id="type-with-comma"),
        pytest.param(dev("A", 1, 0, kind="NVI:DIA"), id="type-with-colon"),
        pytest.param(dev("A", 1, 0, kind="NVI;DIA"), id="type-with-semicolon"),
        pytest.param(dev("A", 1, 0, kind=""), id="empty-type"),
        pytest.param(dev("A", -1, 0), id="negative-memory"),
        pytest.param(dev("A", 1, -1), id="negative-cores"),
        pytest.param(Assigned("A", None, "NVIDIA", memory=cast(Any, 1.5), cores=0), id="float-memory"),
        pytest.param(Assigned("A", None, "NVIDIA", memory=1, cores=cast(Any, "25")), id="str-cores"),
        pytest.param(Assigned("A", None, "NVIDIA", memory=True, cores=0), id="bool-memory"),
    ],
)
@pytest.mark.parametrize("dialect", ["volcano", "hami"])
def test_encode_pod_devices_rejects_bad_devices(device: Assigned, dialect: Any) -> None:
    with pytest.raises(PodDevicesError):
        encode_pod_devices([[A], [device]], dialect)


@pytest.mark.parametrize("dialect", [pytest.param("foo", id="foo"), pytest.param("", id="empty")])
def test_encode_pod_devices_rejects_unknown_dialect(dialect: Any) -> None:
    with pytest.raises(PodDevicesError, match="dialect"):
        encode_pod_devices([[A]], dialect)


# --- pod devices: strict (default) decoding --------------------------------------------------


@pytest.mark.parametrize(
    ("value", "dialect", "expected"),
    [
        pytest.param("A,NVIDIA,3000,25:B,NVIDIA,3000,25:", "volcano", [[A, B]], id="ref-one-container"),
        pytest.param("A,NVIDIA,3000,25:;B,NVIDIA,1000,0:", "volcano", [[A], [B_SMALL]], id="ref-volcano"),
        pytest.param(
            "A,NVIDIA,500,3:;;B,NVIDIA,500,3:;", "hami", [[A_HAMI], [], [B_HAMI]], id="ref-hami-no-phantom"
        ),
        pytest.param("A,NVIDIA,500,3:;", "hami", [[A_HAMI]], id="hami-single"),
        pytest.param(";", "hami", [[]], id="hami-single-empty"),
        pytest.param(";;", "hami", [[], []], id="hami-two-empty"),
        pytest.param("A,NVIDIA,3000,25:;", "volcano", [[A], []], id="volcano-reads-trailing-semicolon"),
        pytest.param(";A,NVIDIA,3000,25:", "volcano", [[], [A]], id="volcano-empty-first"),
        pytest.param("", "volcano", [], id="volcano-empty"),
        pytest.param("", "hami", [], id="hami-empty"),
        pytest.param("GPU-1f3e[config-a-3],NVIDIA,20480,0:", "volcano", [[MIG]], id="mig-id-with-brackets"),
    ],
)
def test_decode_pod_devices(value: str, dialect: Any, expected: Containers) -> None:
    assert decode_pod_devices(value, dialect) == expected


def test_decode_pod_devices_defaults_to_volcano_dialect() -> None:
    assert decode_pod_devices("A,NVIDIA,3000,25:;B,NVIDIA,1000,0:") == [[A], [B_SMALL]]


ROUND_TRIP = [
    pytest.param([[A, B]], id="one-container-two-devices"),
    pytest.param([[A], [B_SMALL]], id="two-containers"),
    pytest.param([[A], [], [B]], id="empty-middle"),
    pytest.param([[], [A]], id="empty-first"),
    pytest.param([[A], []], id="empty-last"),
    pytest.param([[MIG, dev("GPU-2", 0, 100)]], id="mig-and-whole-card"),
    pytest.param([[dev("A", 0, 0, kind="NVIDIA-A100")]], id="zero-usage-other-type"),
    pytest.param([], id="no-containers"),
]


@pytest.mark.parametrize("dialect", ["volcano", "hami"])
@pytest.mark.parametrize("containers", ROUND_TRIP)
def test_pod_devices_round_trip(containers: Containers, dialect: Any) -> None:
    assert decode_pod_devices(encode_pod_devices(containers, dialect), dialect) == containers


@pytest.mark.parametrize("dialect", ["volcano", "hami"])
def test_decoded_pod_devices_carry_no_index(dialect: Any) -> None:
    placed = [[dev("A", 3000, 25, index=2)], [dev("B", 1000, 0, index=0)]]
    decoded = decode_pod_devices(encode_pod_devices(placed, dialect), dialect)
    assert [[d.index for d in devices] for devices in decoded] == [[None], [None]]
    assert decoded == [[A], [B_SMALL]]


def test_hami_keeps_a_lone_empty_container_that_volcano_cannot_express() -> None:
    assert decode_pod_devices(encode_pod_devices([[]], "hami"), "hami") == [[]]
    # The Volcano dialect writes "" for one empty container, which reads back as no containers.
    assert encode_pod_devices([[]], "volcano") == ""
    assert decode_pod_devices("", "volcano") == []


@pytest.mark.parametrize(
    ("value", "dialect", "fragments"),
    [
        pytest.param("A,NVIDIA,3000:", "volcano", ["container 0 device 0", "'A,NVIDIA,3000'"], id="3-fields"),
        pytest.param(
            "A,NVIDIA,3000,25,x:", "volcano", ["container 0 device 0", "'A,NVIDIA,3000,25,x'"], id="5-fields"
        ),
        pytest.param("A:", "volcano", ["container 0 device 0", "'A'"], id="1-field"),
        pytest.param(
            "A,NVIDIA,lots,25:", "volcano", ["container 0 device 0", "memory", "'lots'"], id="memory-word"
        ),
        pytest.param(
            "A,NVIDIA,3000,most:", "volcano", ["container 0 device 0", "cores", "'most'"], id="cores-word"
        ),
        pytest.param("A,NVIDIA,-1,25:", "volcano", ["memory", "'-1'"], id="negative-memory"),
        pytest.param("A,NVIDIA,3000,-5:", "volcano", ["cores", "'-5'"], id="negative-cores"),
        pytest.param("A,NVIDIA,+5,25:", "volcano", ["memory", "'+5'"], id="signed-memory"),
        pytest.param("A,NVIDIA,1.5,25:", "volcano", ["memory", "'1.5'"], id="fractional-memory"),
        pytest.param("A,NVIDIA, 1,25:", "volcano", ["memory", "' 1'"], id="memory-with-space"),
        pytest.param("A,NVIDIA,,25:", "volcano", ["memory", "''"], id="empty-memory"),
        pytest.param("A,NVIDIA,3000,:", "volcano", ["cores", "''"], id="empty-cores"),
        pytest.param(",NVIDIA,3000,25:", "volcano", ["container 0 device 0", "UUID"], id="empty-uuid"),
        pytest.param("A,,3000,25:", "volcano", ["container 0 device 0", "type"], id="empty-type"),
        pytest.param("A,NVIDIA,3000,25", "volcano", ["container 0", "':'"], id="missing-trailing-colon"),
        pytest.param(
            "A,NVIDIA,1,0:;B,NVIDIA,1,0",
            "volcano",
            ["container 1", "'B,NVIDIA,1,0'"],
            id="second-unterminated",
        ),
        pytest.param(
            "A,NVIDIA,1,0:B,NVIDIA,x,0:", "volcano", ["container 0 device 1", "'x'"], id="second-device-bad"
        ),
        pytest.param("A,NVIDIA,1,0::", "volcano", ["container 0 device 1"], id="double-colon"),
        pytest.param(":", "volcano", ["container 0 device 0"], id="lone-colon"),
        pytest.param(
            "A,NVIDIA,1,0:;;C,NVIDIA,1:",
            "volcano",
            ["container 2 device 0", "'C,NVIDIA,1'"],
            id="third-container",
        ),
        pytest.param("A,NVIDIA,500,3:", "hami", ["';'"], id="hami-missing-trailing-semicolon"),
        pytest.param(
            "A,NVIDIA,500,3:;;B,NVIDIA,x,3:;", "hami", ["container 2 device 0", "'x'"], id="hami-bad"
        ),
        pytest.param("A,NVIDIA,500,3;", "hami", ["container 0", "':'"], id="hami-missing-colon"),
    ],
)
def test_decode_pod_devices_strict_errors(value: str, dialect: Any, fragments: list[str]) -> None:
    with pytest.raises(PodDevicesError) as caught:
        decode_pod_devices(value, dialect)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize("value", [pytest.param("", id="empty"), pytest.param("A,NVIDIA,1,0:", id="valid")])
@pytest.mark.parametrize("dialect", [pytest.param("foo", id="foo"), pytest.param("HAMI", id="upper-hami")])
def test_decode_pod_devices_rejects_unknown_dialect(value: str, dialect: Any) -> None:
    with pytest.raises(PodDevicesError, match="dialect"):
        decode_pod_devices(value, dialect)


def test_decode_pod_devices_strict_rejects_non_ascii_digits() -> None:
    with pytest.raises(PodDevicesError):
        decode_pod_devices("A,NVIDIA,\u0663\u0660\u0660\u0660,25:")


# --- pod devices: compat="volcano" decoding --------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("A,NVIDIA,3000,25:B,NVIDIA,3000,25:", [[A, B]], id="ref-one-container"),
        pytest.param("A,NVIDIA,3000,25:;B,NVIDIA,1000,0:", [[A], [B_SMALL]], id="ref-two-containers"),
        pytest.param("", [], id="empty"),
        pytest.param("A,NVIDIA,3000,25:;;B,NVIDIA,3000,25:", [[A], [], [B]], id="empty-middle"),
        pytest.param("A,NVIDIA,500,3:;", [[A_HAMI], []], id="trailing-semicolon-adds-container"),
        pytest.param("A,NVIDIA,3000,25:junk:B,NVIDIA,3000,25:", [[A, B]], id="piece-without-comma-ignored"),
        pytest.param("A,NVIDIA,3000,25", [[A]], id="no-trailing-colon-needed"),
        pytest.param("A,NVIDIA,3000,25::", [[A]], id="empty-pieces-ignored"),
        pytest.param("A,NVIDIA,3000:B,NVIDIA,3000,25:", [[B]], id="3-fields-skipped"),
        pytest.param("A,NVIDIA:B,NVIDIA,3000,25:", [[B]], id="2-fields-skipped"),
        pytest.param("A,NVIDIA,3000,25,extra:", [[A]], id="5-fields-read-first-4"),
        pytest.param("A,NVIDIA,lots,25:B,NVIDIA,3000,25:", [[B]], id="memory-word-skipped"),
        pytest.param("A,NVIDIA,3000,most:B,NVIDIA,3000,25:", [[B]], id="cores-word-skipped"),
        pytest.param("A,NVIDIA,-1,25:B,NVIDIA,3000,25:", [[B]], id="negative-memory-skipped"),
        pytest.param("A,NVIDIA,3000,-1:B,NVIDIA,3000,25:", [[B]], id="negative-cores-skipped"),
        pytest.param("A,NVIDIA,+5,25:B,NVIDIA,3000,25:", [[B]], id="signed-memory-skipped"),
        pytest.param("A,NVIDIA,,25:B,NVIDIA,3000,25:", [[B]], id="empty-memory-skipped"),
        pytest.param("A,NVIDIA,4294967296,25:B,NVIDIA,3000,25:", [[B]], id="memory-above-uint32-skipped"),
        pytest.param("A,NVIDIA,3000,4294967296:B,NVIDIA,3000,25:", [[B]], id="cores-above-uint32-skipped"),
        pytest.param("A,NVIDIA,4294967295,25:", [[dev("A", 2**32 - 1, 25)]], id="uint32-max-kept"),
        pytest.param("A,NVIDIA,x,0:;B,NVIDIA,1000,0:", [[], [B_SMALL]], id="container-kept-when-emptied"),
        pytest.param(",NVIDIA,3000,25:", [[dev("", 3000, 25)]], id="empty-uuid-kept"),
        pytest.param("GPU-1f3e[config-a-3],NVIDIA,20480,0:", [[MIG]], id="mig-id"),
    ],
)
def test_decode_pod_devices_volcano_compat(value: str, expected: Containers) -> None:
    assert decode_pod_devices(value, "volcano", compat="volcano") == expected


@pytest.mark.parametrize(
    "value", [pytest.param("", id="empty"), pytest.param("A,NVIDIA,500,3:;", id="hami-value")]
)
def test_decode_pod_devices_volcano_compat_rejects_hami_dialect(value: str) -> None:
    with pytest.raises(PodDevicesError):
        decode_pod_devices(value, "hami", compat="volcano")


def test_decode_pod_devices_volcano_compat_skips_non_ascii_digits() -> None:
    assert decode_pod_devices("A,NVIDIA,\u0663,25:", compat="volcano") == [[]]


# --- node registration: encoding -------------------------------------------------------------


def test_encode_node_register_orders_by_index() -> None:
    gpus = [
        card(2, "GPU-c", mode="mps"),
        card(0, "GPU-a", health=False),
        card(1, "GPU-b", count=4, memory=16384, kind="NVIDIA-T4", mode="mig"),
    ]
    assert encode_node_register(gpus) == (
        f"GPU-a,10,32768,{V100},false,hami-core:GPU-b,4,16384,NVIDIA-T4,true,mig:GPU-c,10,32768,{V100},true,mps:"
    )


def test_encode_node_register_legacy_writes_five_fields() -> None:
    gpus = [card(1, "GPU-b", mode="mig"), card(0, "GPU-a", health=False)]
    assert (
        encode_node_register(gpus, legacy=True) == f"GPU-a,10,32768,{V100},false:GPU-b,10,32768,{V100},true:"
    )


def test_encode_node_register_empty() -> None:
    assert encode_node_register([]) == ""


@pytest.mark.parametrize(
    "gpu",
    [
        pytest.param(card(0, "GPU,a"), id="uuid-with-comma"),
        pytest.param(card(0, "GPU:a"), id="uuid-with-colon"),
        pytest.param(card(0, "GPU;a"), id="uuid-with-semicolon"),
        pytest.param(card(0, ""), id="empty-uuid"),
        pytest.param(card(0, "GPU-a", kind="NVIDIA:T4"), id="type-with-colon"),
        pytest.param(card(0, "GPU-a", kind=""), id="empty-type"),
        pytest.param(card(0, "GPU-a", count=-1), id="negative-count"),
        pytest.param(card(0, "GPU-a", memory=-1), id="negative-memory"),
        pytest.param(card(0, "GPU-a", mode="foo"), id="unknown-mode"),
    ],
)
def test_encode_node_register_rejects_bad_gpus(gpu: GpuState) -> None:
    with pytest.raises(NodeRegisterError):
        encode_node_register([card(1, "GPU-ok"), gpu])


# --- node registration: strict (default) decoding --------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(
            f"GPU-aa,10,32768,{V100},true,hami-core:GPU-bb,10,32768,{V100},true,hami-core:",
            [card(0, "GPU-aa"), card(1, "GPU-bb")],
            id="ref-example",
        ),
        pytest.param(
            "GPU-a,4,16384,NVIDIA-T4,false,mig:GPU-b,2,8192,NVIDIA-T4,true,mps:",
            [
                card(0, "GPU-a", count=4, memory=16384, kind="NVIDIA-T4", health=False, mode="mig"),
                card(1, "GPU-b", count=2, memory=8192, kind="NVIDIA-T4", mode="mps"),
            ],
            id="health-and-modes",
        ),
        pytest.param(
            f"GPU-a,10,32768,{V100},true:GPU-b,10,32768,{V100},false:",
            [card(0, "GPU-a"), card(1, "GPU-b", health=False)],
            id="legacy-5-field-is-hami-core",
        ),
        pytest.param(
            f"GPU-a,10,32768,{V100},true:GPU-b,10,32768,{V100},true,mig:",
            [card(0, "GPU-a"), card(1, "GPU-b", mode="mig")],
            id="legacy-and-current-mixed",
        ),
        pytest.param("", [], id="empty"),
    ],
)
def test_decode_node_register(value: str, expected: list[GpuState]) -> None:
    assert decode_node_register(value) == expected


ROUND_TRIP_GPUS = [
    card(0, "GPU-a", health=False),
    card(1, "GPU-b", count=4, memory=16384, kind="NVIDIA-T4", mode="mig"),
    card(2, "GPU-c", mode="mps"),
]


def test_node_register_round_trip() -> None:
    shuffled = [ROUND_TRIP_GPUS[2], ROUND_TRIP_GPUS[0], ROUND_TRIP_GPUS[1]]
    assert decode_node_register(encode_node_register(shuffled)) == ROUND_TRIP_GPUS


def test_node_register_legacy_round_trip_loses_mode() -> None:
    decoded = decode_node_register(encode_node_register(ROUND_TRIP_GPUS, legacy=True))
    assert [g.mode for g in decoded] == ["hami-core"] * 3
    assert [(g.uuid, g.split_count, g.memory, g.type, g.health) for g in decoded] == [
        (g.uuid, g.split_count, g.memory, g.type, g.health) for g in ROUND_TRIP_GPUS
    ]


def test_node_register_index_is_position_not_original_index() -> None:
    sparse = [card(7, "GPU-x"), card(3, "GPU-w")]
    assert [(g.index, g.uuid) for g in decode_node_register(encode_node_register(sparse))] == [
        (0, "GPU-w"),
        (1, "GPU-x"),
    ]


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        pytest.param("GPU-a,10,100,T,true,hami-core", ["':'"], id="missing-trailing-colon"),
        pytest.param("GPU-a,10,100,T:", ["GPU 0", "'GPU-a,10,100,T'"], id="4-fields"),
        pytest.param("GPU-a,10,100,T,true,hami-core,x:", ["GPU 0", "hami-core,x"], id="7-fields"),
        pytest.param(
            entry() + "GPU-b,ten,100,T,true,hami-core:", ["GPU 1", "count", "'ten'"], id="count-word"
        ),
        pytest.param(entry(memory="lots"), ["GPU 0", "memory", "'lots'"], id="memory-word"),
        pytest.param(entry(count="-1"), ["count", "'-1'"], id="negative-count"),
        pytest.param(entry(memory="1.5"), ["memory", "'1.5'"], id="fractional-memory"),
        pytest.param(entry(memory=""), ["memory", "''"], id="empty-memory"),
        pytest.param(entry(health="yes"), ["GPU 0", "health", "'yes'"], id="health-yes"),
        pytest.param(entry(health=""), ["health", "''"], id="health-empty"),
        pytest.param("GPU-a,10,100,T,true,foo:", ["GPU 0", "mode", "'foo'"], id="mode-foo"),
        pytest.param("GPU-a,10,100,T,true,:", ["mode", "''"], id="mode-empty"),
        pytest.param("GPU-a,10,100,T,true,MIG:", ["mode", "'MIG'"], id="mode-uppercase"),
        pytest.param(entry("GPU-a") + entry("GPU-a"), ["GPU-a", "twice"], id="duplicate-uuid"),
        pytest.param(",10,100,T,true,hami-core:", ["GPU 0", "UUID"], id="empty-uuid"),
        pytest.param("GPU-a,10,100,,true,hami-core:", ["GPU 0", "type"], id="empty-type"),
        pytest.param(entry("GPU-a") + ":" + entry("GPU-b"), ["GPU 1"], id="empty-piece"),
        pytest.param(":", ["GPU 0"], id="lone-colon"),
    ],
)
def test_decode_node_register_strict_errors(value: str, fragments: list[str]) -> None:
    with pytest.raises(NodeRegisterError) as caught:
        decode_node_register(value)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message


def test_decode_node_register_strict_rejects_non_ascii_digits() -> None:
    with pytest.raises(NodeRegisterError):
        decode_node_register(entry(count="\u0661\u0660"))


# --- node registration: compat="volcano" decoding --------------------------------------------


def volcano_register(value: str) -> list[GpuState]:
    return decode_node_register(value, compat="volcano")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("", [], id="empty"),
        pytest.param("GPU-a,10,100,T,true,hami-core", [], id="no-colon-at-all"),
        pytest.param(entry("GPU-a") + "GPU-b,10,100,T,true:", [], id="one-legacy-entry-voids-node"),
        pytest.param(f"GPU-a,10,32768,{V100},true:", [], id="legacy-only-node-voided"),
        pytest.param("GPU-a,10,100:" + entry("GPU-b"), [], id="short-first-entry-voids-node"),
        pytest.param(
            entry("GPU-a") + "junk:" + entry("GPU-b"),
            [card(0, "GPU-a", memory=100, kind="T"), card(2, "GPU-b", memory=100, kind="T")],
            id="comma-less-piece-skipped-but-counted",
        ),
        pytest.param(
            entry("GPU-a") + ":" + entry("GPU-b"),
            [card(0, "GPU-a", memory=100, kind="T"), card(2, "GPU-b", memory=100, kind="T")],
            id="empty-piece-leaves-index-gap",
        ),
        pytest.param(
            entry("GPU-a") + "GPU-b,10,100,T,true,hami-core",
            [card(0, "GPU-a", memory=100, kind="T"), card(1, "GPU-b", memory=100, kind="T")],
            id="unterminated-last-entry-read",
        ),
        pytest.param(
            "GPU-a,10,100,T,true,mig,extra:",
            [card(0, "GPU-a", memory=100, kind="T", mode="mig")],
            id="7-fields-read-first-6",
        ),
        pytest.param(
            entry("GPU-a") + entry("GPU-a"),
            [card(0, "GPU-a", memory=100, kind="T"), card(1, "GPU-a", memory=100, kind="T")],
            id="duplicate-uuid-kept",
        ),
        pytest.param(
            ",10,100,,true,hami-core:",
            [card(0, "", memory=100, kind="")],
            id="empty-uuid-and-type-kept",
        ),
    ],
)
def test_decode_node_register_volcano_compat(value: str, expected: list[GpuState]) -> None:
    assert volcano_register(value) == expected


@pytest.mark.parametrize(
    ("count", "memory", "expected"),
    [
        pytest.param("ten", "100", (0, 100), id="count-word-is-0"),
        pytest.param("10", "lots", (10, 0), id="memory-word-is-0"),
        pytest.param("", "", (0, 0), id="empty-numbers-are-0"),
        pytest.param("10", "1.5", (10, 0), id="fractional-memory-is-0"),
        pytest.param("10", " 100", (10, 0), id="space-is-0"),
        pytest.param("10", "0x10", (10, 0), id="hex-is-0"),
        pytest.param("+8", "+100", (8, 100), id="plus-sign-accepted"),
        pytest.param("007", "0100", (7, 100), id="leading-zeros"),
    ],
)
def test_decode_node_register_volcano_compat_atoi(count: str, memory: str, expected: tuple[int, int]) -> None:
    (gpu,) = volcano_register(entry(count=count, memory=memory))
    assert (gpu.split_count, gpu.memory) == expected


GO_TRUE = ["1", "t", "T", "TRUE", "true", "True"]
GO_FALSE = ["0", "f", "F", "FALSE", "false", "False"]
NOT_GO_BOOL = ["yes", "no", "on", "tRuE", "", " true", "2"]


@pytest.mark.parametrize(
    ("health", "expected"),
    [pytest.param(h, True, id=f"true-{h}") for h in GO_TRUE]
    + [pytest.param(h, False, id=f"false-{h}") for h in GO_FALSE]
    + [pytest.param(h, False, id=f"unparsable-{h!r}") for h in NOT_GO_BOOL],
)
def test_decode_node_register_volcano_compat_parse_bool(health: str, expected: bool) -> None:
    (gpu,) = volcano_register(entry(health=health))
    assert gpu.health is expected


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        pytest.param("mig", "mig", id="mig"),
        pytest.param("hami-core", "hami-core", id="hami-core"),
        pytest.param("mps", "hami-core", id="mps-becomes-hami-core"),
        pytest.param("foo", "hami-core", id="unknown-becomes-hami-core"),
        pytest.param("", "hami-core", id="empty-becomes-hami-core"),
        pytest.param("MIG", "hami-core", id="uppercase-MIG-is-not-mig"),
    ],
)
def test_decode_node_register_volcano_compat_mode(mode: str, expected: str) -> None:
    (gpu,) = volcano_register(f"GPU-a,10,100,T,true,{mode}:")
    assert gpu.mode == expected


def test_decode_node_register_volcano_compat_out_of_range_count() -> None:
    (gpu,) = volcano_register(entry(count="99999999999999999999"))
    assert gpu.split_count == 2**63 - 1


def test_decode_node_register_volcano_compat_non_ascii_digits_read_as_zero() -> None:
    (gpu,) = volcano_register(entry(count="\u0661\u0660"))
    assert gpu.split_count == 0


# --- gpu-index and gpu-unhealthy-ids ---------------------------------------------------------


@pytest.mark.parametrize(
    ("indices", "text"),
    [
        pytest.param([0], "0", id="single"),
        pytest.param([0, 2, 3], "0,2,3", id="several"),
        pytest.param([3, 1], "3,1", id="order-kept"),
        pytest.param([12], "12", id="two-digits"),
    ],
)
def test_gpu_index_round_trip(indices: list[int], text: str) -> None:
    assert format_gpu_index(indices) == text
    assert parse_gpu_index(text) == indices


def test_format_gpu_index_accepts_generators() -> None:
    assert format_gpu_index(i for i in (1, 0)) == "1,0"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(" 1", [1], id="leading-space"),
        pytest.param("0 , 2,3 ", [0, 2, 3], id="spaces-around-items"),
        pytest.param("\t4\n", [4], id="tab-and-newline"),
        pytest.param("007", [7], id="leading-zeros"),
    ],
)
def test_parse_gpu_index_trims(text: str, expected: list[int]) -> None:
    assert parse_gpu_index(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param(" ", id="blank"),
        pytest.param("a", id="letter"),
        pytest.param("1,,2", id="empty-item"),
        pytest.param("1,", id="trailing-comma"),
        pytest.param(",1", id="leading-comma"),
        pytest.param("-1", id="negative"),
        pytest.param("+1", id="plus-sign"),
        pytest.param("1.5", id="fractional"),
        pytest.param("0x1", id="hex"),
        pytest.param("1 2", id="inner-space"),
        pytest.param("1;2", id="semicolon"),
        pytest.param("1,1", id="duplicate"),
        pytest.param("0,2,0", id="duplicate-apart"),
    ],
)
def test_parse_gpu_index_errors(text: str) -> None:
    with pytest.raises(GpuIndexError):
        parse_gpu_index(text)


def test_parse_gpu_index_error_names_the_bad_item() -> None:
    with pytest.raises(GpuIndexError, match="'x'"):
        parse_gpu_index("0,x,2")


def test_parse_gpu_index_rejects_non_ascii_digits() -> None:
    with pytest.raises(GpuIndexError):
        parse_gpu_index("\u0663")


@pytest.mark.parametrize(
    "indices",
    [
        pytest.param([], id="empty"),
        pytest.param([-1], id="negative"),
        pytest.param([0, -2], id="negative-later"),
        pytest.param([True], id="bool"),
        pytest.param([1.0], id="float"),
        pytest.param(["1"], id="str"),
    ],
)
def test_format_gpu_index_errors(indices: list[Any]) -> None:
    with pytest.raises(GpuIndexError):
        format_gpu_index(indices)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", set(), id="empty"),
        pytest.param("   ", set(), id="blank"),
        pytest.param("0,2", {0, 2}, id="two"),
        pytest.param("3", {3}, id="one"),
        pytest.param(" 1 , 3", {1, 3}, id="trimmed"),
    ],
)
def test_parse_unhealthy_ids_strict(text: str, expected: set[int]) -> None:
    assert parse_unhealthy_ids(text) == frozenset(expected)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("0,x", id="letter"),
        pytest.param("0,,2", id="empty-item"),
        pytest.param("-1", id="negative"),
        pytest.param("1.5", id="fractional"),
        pytest.param("GPU-0", id="uuid-instead-of-index"),
    ],
)
def test_parse_unhealthy_ids_strict_errors(text: str) -> None:
    with pytest.raises(GpuIndexError):
        parse_unhealthy_ids(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", set(), id="empty"),
        pytest.param("0,2", {0, 2}, id="two"),
        pytest.param("0,x,2", {0, 2}, id="letter-skipped"),
        pytest.param(" 1", set(), id="space-rejected-by-atoi"),
        pytest.param("1 ,2", {2}, id="trailing-space-rejected"),
        pytest.param("0,,2", {0, 2}, id="empty-item-skipped"),
        pytest.param("1.5,3", {3}, id="fractional-skipped"),
        pytest.param("1,1", {1}, id="duplicate-collapsed"),
        pytest.param("+2", {2}, id="plus-sign-accepted"),
        pytest.param("-1", {-1}, id="negative-kept"),
        pytest.param("GPU-0", set(), id="uuid-skipped"),
    ],
)
def test_parse_unhealthy_ids_volcano_compat(text: str, expected: set[int]) -> None:
    assert parse_unhealthy_ids(text, compat="volcano") == frozenset(expected)


def test_parse_unhealthy_ids_volcano_compat_skips_non_ascii_digits() -> None:
    assert parse_unhealthy_ids("\u0663,1", compat="volcano") == frozenset({1})


def test_parse_unhealthy_ids_volcano_compat_skips_out_of_range_items() -> None:
    assert parse_unhealthy_ids("99999999999999999999,1", compat="volcano") == frozenset({1})


# --- MIG device IDs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uuid", "group", "position"),
    [
        pytest.param("GPU-1", "config1", 0, id="simple"),
        pytest.param("GPU-8f2c-41aa", "config-a", 3, id="dash-in-uuid-and-group"),
        pytest.param("GPU-1", "a-b-c", 12, id="several-dashes-in-group"),
        pytest.param("GPU-1", "g", 7, id="one-letter-group"),
    ],
)
def test_mig_id_round_trip(uuid: str, group: str, position: int) -> None:
    device_id = encode_mig_id(uuid, group, position)
    assert device_id == f"{uuid}[{group}-{position}]"
    assert decode_mig_id(device_id) == (uuid, group, position)
    assert physical_uuid(device_id) == uuid


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        pytest.param("GPU-1[config-a-3]", ("GPU-1", "config-a", 3), id="splits-at-last-dash"),
        pytest.param("GPU-1[g-007]", ("GPU-1", "g", 7), id="leading-zeros"),
        pytest.param("GPU-1[1-2]", ("GPU-1", "1", 2), id="numeric-group"),
    ],
)
def test_decode_mig_id(device_id: str, expected: tuple[str, str, int]) -> None:
    assert decode_mig_id(device_id) == expected


@pytest.mark.parametrize(
    "device_id",
    [
        pytest.param("GPU-1", id="plain-uuid"),
        pytest.param("", id="empty"),
        pytest.param("GPU-1[]", id="empty-brackets"),
        pytest.param("GPU-1[g]", id="no-position"),
        pytest.param("GPU-1[g-]", id="empty-position"),
        pytest.param("GPU-1[-1]", id="empty-group"),
        pytest.param("GPU-1[g-x]", id="word-position"),
        pytest.param("GPU-1[g-1.5]", id="fractional-position"),
        pytest.param("GPU-1[g-1", id="unclosed"),
        pytest.param("GPU-1g-1]", id="unopened"),
        pytest.param("GPU-1[g-1]x", id="text-after-bracket"),
        pytest.param("[g-1]", id="empty-uuid"),
        pytest.param("GPU-1[[g-1]]", id="nested-brackets"),
        pytest.param("GPU-1[g-1][h-2]", id="two-suffixes"),
        pytest.param("GPU-1]g-1[", id="reversed-brackets"),
    ],
)
def test_decode_mig_id_errors(device_id: str) -> None:
    with pytest.raises(PodDevicesError):
        decode_mig_id(device_id)


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        pytest.param("GPU-1[config-a-3]", "GPU-1", id="mig-id"),
        pytest.param("GPU-1", "GPU-1", id="plain-uuid"),
        pytest.param("GPU-8f2c-41aa[g-0]", "GPU-8f2c-41aa", id="dashes-in-uuid"),
        pytest.param("", "", id="empty"),
    ],
)
def test_physical_uuid(device_id: str, expected: str) -> None:
    assert physical_uuid(device_id) == expected


@pytest.mark.parametrize(
    ("uuid", "group", "position"),
    [
        pytest.param("GPU-1", "g", -1, id="negative-position"),
        pytest.param("GPU-1", "", 0, id="empty-group"),
        pytest.param("GPU-1", "g]", 0, id="bracket-in-group"),
        pytest.param("GPU[1", "g", 0, id="bracket-in-uuid"),
    ],
)
def test_encode_mig_id_refuses_ids_that_would_read_back_differently(
    uuid: str, group: str, position: int
) -> None:
    with pytest.raises(PodDevicesError):
        encode_mig_id(uuid, group, position)


# --- the compat flag -------------------------------------------------------------------------

BAD_COMPAT = [
    pytest.param("hami", id="hami"),
    pytest.param(True, id="True"),
    pytest.param(False, id="False"),
    pytest.param("Volcano", id="capitalised"),
    pytest.param("", id="empty-string"),
    pytest.param(1, id="one"),
]


@pytest.mark.parametrize("compat", BAD_COMPAT)
def test_decode_pod_devices_rejects_bad_compat(compat: Any) -> None:
    with pytest.raises(ConfigError, match="compat"):
        decode_pod_devices("A,NVIDIA,1,0:", compat=compat)


@pytest.mark.parametrize("compat", BAD_COMPAT)
def test_decode_node_register_rejects_bad_compat(compat: Any) -> None:
    with pytest.raises(ConfigError, match="compat"):
        decode_node_register(entry(), compat=compat)


@pytest.mark.parametrize("compat", BAD_COMPAT)
def test_parse_unhealthy_ids_rejects_bad_compat(compat: Any) -> None:
    with pytest.raises(ConfigError, match="compat"):
        parse_unhealthy_ids("0", compat=compat)
