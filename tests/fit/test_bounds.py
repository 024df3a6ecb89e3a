"""Numbers longer than Kubernetes or Volcano write (issue 13, F1, F2): a clear `FitInputError`
naming the field by default, and Go's own reading under compat="volcano" (Atoi and ParseUint
clamp or fail, and Volcano falls back), both decided before anything is converted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from deviceplugin.fit import (
    Compat,
    FitInputError,
    GpuIndexError,
    NodeRegisterError,
    PodDevicesError,
    PodFormatError,
    QuantityError,
    decode_mig_id,
    decode_node_register,
    decode_pod_devices,
    gpushare_cards,
    objects,
    parse_gpu_index,
    parse_quantity,
    parse_unhealthy_ids,
)
from deviceplugin.fit.bounds import MAX_NODE_GPUS
from deviceplugin.fit.codec import decode_mig_id_volcano, parse_gpu_index_volcano
from deviceplugin.fit.goint import parse_int, parse_uint
from deviceplugin.fit.quantity import go_quantity_as_int64, go_quantity_value

INT64_MAX = 2**63 - 1
POISON = "9" * 4301  # one digit past what int() converts
HUGE = "9" * 5000


@pytest.mark.parametrize(
    ("read", "error", "fragment"),
    [
        (lambda: parse_gpu_index(POISON), GpuIndexError, "item has 4301 digits; a GPU index has at most 19"),
        (lambda: parse_unhealthy_ids(f"1,{POISON}"), GpuIndexError, "item has 4301 digits"),
        (
            lambda: decode_pod_devices(f"GPU-a,NVIDIA,{HUGE},0:"),
            PodDevicesError,
            "memory has 5000 digits; an int64 has at most 19",
        ),
        (lambda: decode_pod_devices(f"GPU-a,NVIDIA,1,{HUGE}:"), PodDevicesError, "cores has 5000 digits"),
        (
            lambda: decode_node_register(f"GPU-a,10,{HUGE},NVIDIA,true,hami-core:"),
            NodeRegisterError,
            "memory has 5000 digits; an int64 has at most 19",
        ),
        (
            lambda: decode_node_register(f"GPU-a,{HUGE},1,NVIDIA,true,hami-core:"),
            NodeRegisterError,
            "count has 5000 digits",
        ),
        (lambda: decode_mig_id(f"GPU-a[g0-{HUGE}]"), PodDevicesError, "position has 5000 digits"),
        (
            lambda: parse_quantity(HUGE),
            QuantityError,
            "has 5000 characters; the API server writes at most 64",
        ),
        (lambda: parse_quantity("1e999999999"), QuantityError, "exponent 999999999 is beyond ±64"),
        (lambda: parse_quantity(10**5000), QuantityError, "a Kubernetes quantity has at most 64 digits"),
    ],
    ids=[
        "gpu-index",
        "unhealthy-ids",
        "device-memory",
        "device-cores",
        "register-memory",
        "register-count",
        "mig-position",
        "quantity-text",
        "quantity-exponent",
        "quantity-json-number",
    ],
)
def test_strict_readers_name_the_overlong_field(
    read: Callable[[], object], error: type[FitInputError], fragment: str
) -> None:
    with pytest.raises(error) as caught:
        read()
    assert fragment in str(caught.value)
    assert len(str(caught.value)) < 300  # the value is clipped, not copied into logs and Events


def test_volcano_reads_long_annotation_numbers_as_go_does() -> None:
    # Atoi's range error discards the whole gpu-index list; leading zeros are just zeros.
    assert parse_gpu_index_volcano(POISON) is None
    assert parse_gpu_index_volcano("0" * 4400 + "1,2") == [1, 2]
    # Unparsable unhealthy IDs are skipped.
    assert parse_unhealthy_ids(f"{POISON},1", "volcano") == frozenset({1})
    # Register fields ignore Atoi's error and keep its value: clamped, even when junk follows the
    # overflow (Go stops at the overflow and reports a range error, not a syntax error).
    (gpu,) = decode_node_register(f"GPU-a,{HUGE},{'9' * 25}x,NVIDIA,true,hami-core:", "volcano")
    assert (gpu.split_count, gpu.memory) == (INT64_MAX, INT64_MAX)
    (gpu,) = decode_node_register(f"GPU-a,-{HUGE},12x,NVIDIA,true,hami-core:", "volcano")
    assert (gpu.split_count, gpu.memory) == (-(2**63), 0)
    # Pod devices: ParseUint(…, 32) errors skip the device.
    (devices,) = decode_pod_devices(f"GPU-a,NVIDIA,{'0' * 5000}7,1:GPU-b,NVIDIA,{HUGE},1:", compat="volcano")
    assert [(d.uuid, d.memory) for d in devices] == [("GPU-a", 7)]
    assert decode_mig_id_volcano(f"GPU-a[g0-{HUGE}]") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", (0, False)),
        ("-", (0, False)),
        ("+7", (7, True)),
        ("-9223372036854775808", (-(2**63), True)),
        ("9223372036854775808", (INT64_MAX, False)),
        ("0" * 5000 + "42", (42, True)),
        (HUGE, (INT64_MAX, False)),
        ("-" + HUGE, (-(2**63), False)),
        ("9" * 20 + "x", (INT64_MAX, False)),  # the overflow comes first: a range error
        ("12x", (0, False)),
        ("\u0661", (0, False)),  # other scripts' digits are not digits to Go
    ],
)
def test_parse_int_is_strconv(text: str, expected: tuple[int, bool]) -> None:
    assert parse_int(text) == expected


def test_parse_uint_32_is_strconv() -> None:
    assert parse_uint("4294967295", 32) == (2**32 - 1, True)
    assert parse_uint("4294967296", 32) == (2**32 - 1, False)
    assert parse_uint(HUGE + "x", 32) == (2**32 - 1, False)
    assert parse_uint("+1", 32) == (0, False)


@pytest.mark.parametrize(
    ("text", "value", "as_int64"),
    [
        ("9" * 60, INT64_MAX, None),  # the slow path: capped at 2^63-1
        ("-" + "9" * 60, -INT64_MAX, None),
        ("1e999999999", INT64_MAX, None),  # the fast path with a huge scale, without a bignum
        ("1e-999999999", 1, None),  # rounded up
        ("0e999999999", 0, 0),
        ("1e4294967296", 1, 1),  # Go reads the exponent as an int64 and keeps int32(it): 0
        ("0." + "0" * 50 + "1", 1, None),
    ],
)
def test_volcano_quantities_of_any_magnitude(text: str, value: int, as_int64: int | None) -> None:
    assert go_quantity_value(text) == value
    assert go_quantity_as_int64(text) == as_int64


@pytest.mark.parametrize("text", ["9" * 65, "1e9223372036854775808"])
def test_quantities_the_api_server_never_writes_are_errors_under_compat_too(text: str) -> None:
    # Longer than any canonical quantity; an exponent Go's own parser rejects.
    with pytest.raises(QuantityError):
        go_quantity_value(text)


@pytest.mark.parametrize("compat", [None, "volcano"])
def test_a_node_claiming_a_trillion_gpus_is_refused(compat: Compat) -> None:
    """Building its cards would take the process's memory (Volcano's too)."""

    def node(number: str) -> dict[str, Any]:
        capacity = {"volcano.sh/gpu-memory": "1", "volcano.sh/gpu-number": number}
        return {"metadata": {"name": "n"}, "status": {"capacity": capacity}}

    with pytest.raises(QuantityError, match=f"1000000000000; a node has at most {MAX_NODE_GPUS} GPUs"):
        gpushare_cards(node("1e12"), compat=compat)
    assert len(gpushare_cards(node(str(MAX_NODE_GPUS)), compat=compat)) == MAX_NODE_GPUS


def test_a_registration_listing_more_gpus_than_a_node_has_is_refused() -> None:
    entry = "GPU-{},1,1,T4,true,hami-core:"
    assert len(decode_node_register("".join(entry.format(i) for i in range(MAX_NODE_GPUS)))) == MAX_NODE_GPUS
    with pytest.raises(NodeRegisterError, match=f"lists {MAX_NODE_GPUS + 1} GPUs"):
        decode_node_register("".join(entry.format(i) for i in range(MAX_NODE_GPUS + 1)))


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (
            {"metadata": {"annotations": {"volcano.sh/gpu-index": 7}}},
            "metadata.annotations values must be strings",
        ),
        ({"metadata": {"labels": {"app": None}}}, "metadata.labels values must be strings"),
        ({"metadata": ["x"]}, "object.metadata must be an object, not list"),
        ([], "object must be an object, not list"),
    ],
)
def test_objects_not_shaped_like_api_json_are_format_errors(obj: object, fragment: str) -> None:
    read = objects.labels_of if "labels" in fragment else objects.annotations_of
    with pytest.raises(PodFormatError, match=fragment):
        read(obj)  # type: ignore[arg-type]
