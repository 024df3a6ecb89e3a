"""Property tests: every decoder and object reader of the fit library answers any input with a
value or a `FitInputError`, never another exception (issue 13: a 4,301-digit annotation raised
`ValueError: Exceeds the limit (4300 digits)` from `int()` and killed a pod cache).

Go's integer parsers are also checked against the transcription of `strconv` on the same text.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from deviceplugin.fit import (
    add_gpushare_pod,
    add_vgpu_pod,
    decode_mig_id,
    decode_node_register,
    decode_pod_devices,
    fit_gpushare,
    fit_vgpu,
    goint,
    gpushare_cards,
    has_vgpu_request,
    holds_gpus,
    objects,
    parse_gpu_index,
    parse_quantity,
    parse_unhealthy_ids,
    parse_vgpu_requests,
    pod_gpu_memory,
    pod_gpu_number,
    vgpu_gpus,
)
from deviceplugin.fit.codec import decode_mig_id_volcano, parse_gpu_index_volcano
from deviceplugin.fit.quantity import (
    go_quantity_as_int64,
    go_quantity_value,
    quantity_as_int64,
    quantity_ceil,
)
from deviceplugin.fit.vgpu_slots import vgpu_slot_owners
from tests.fit import volcano_go as go
from tests.fuzz import FUZZ, codec_text, nodes, pods, quantities, value_or_fit_error

COMPATS = st.sampled_from([None, "volcano"])
POISON = "9" * 4301  # the issue's: one digit past what int() converts


@FUZZ
@given(codec_text)
@example(POISON)
@example(f"0,{POISON}")
def test_gpu_index_decoders(text: str) -> None:
    value_or_fit_error(lambda: parse_gpu_index(text))
    value_or_fit_error(lambda: parse_gpu_index_volcano(text))
    value_or_fit_error(lambda: parse_unhealthy_ids(text))
    value_or_fit_error(lambda: parse_unhealthy_ids(text, "volcano"))


@FUZZ
@given(codec_text, st.sampled_from(["volcano", "hami"]))
@example(f"GPU-a,NVIDIA,{POISON},0:", "volcano")
@example(f"GPU-a[g0-{POISON}],NVIDIA,1,1:;", "hami")
def test_pod_devices_and_mig_id_decoders(text: str, dialect: Any) -> None:
    value_or_fit_error(lambda: decode_pod_devices(text, dialect))
    value_or_fit_error(lambda: decode_pod_devices(text, compat="volcano"))
    value_or_fit_error(lambda: decode_mig_id(text))
    value_or_fit_error(lambda: decode_mig_id_volcano(text))


@FUZZ
@given(codec_text, COMPATS)
@example(f"GPU-a,10,{POISON},NVIDIA,true,hami-core:", None)
@example(f"GPU-a,{POISON},1,NVIDIA,true,hami-core:", "volcano")
def test_node_register_decoder(text: str, compat: Any) -> None:
    value_or_fit_error(lambda: decode_node_register(text, compat))


@FUZZ
@given(quantities)
@example("9" * 5000)
@example("1e999999999")  # not a bignum: Go's value, or a clear error
@example(10**5000)
def test_quantity_readers(value: object) -> None:
    for read in (parse_quantity, quantity_ceil, quantity_as_int64, go_quantity_value, go_quantity_as_int64):
        value_or_fit_error(partial(read, value))


@FUZZ
@given(codec_text)
def test_go_integer_parsers_read_as_strconv_does(text: str) -> None:
    # Same (value, ok) as the transcription's digit-by-digit loop, on text of any length.
    assert goint.parse_int(text) == go.atoi(text)
    assert goint.parse_uint(text, 32) == go.parse_uint32(text)


@FUZZ
@given(pods, COMPATS)
def test_pod_readers(pod: Any, compat: Any) -> None:
    for read in (
        objects.annotations_of,
        objects.labels_of,
        objects.containers,
        objects.init_containers,
        objects.display_name,
        objects.podgroup_key,
        objects.is_terminating,
        vgpu_slot_owners,
    ):
        value_or_fit_error(partial(read, pod))
    value_or_fit_error(lambda: holds_gpus(pod, compat))
    value_or_fit_error(lambda: pod_gpu_memory(pod, compat))
    value_or_fit_error(lambda: pod_gpu_number(pod, compat))
    value_or_fit_error(lambda: has_vgpu_request(pod, compat=compat))
    value_or_fit_error(lambda: parse_vgpu_requests(pod, compat=compat))


_VGPU_NODE = {
    "metadata": {
        "name": "node-a",
        "annotations": {"volcano.sh/node-vgpu-register": "GPU-a,10,1000,NVIDIA,true,hami-core:"},
    },
    "status": {
        "allocatable": {
            "volcano.sh/vgpu-number": "10",
            "volcano.sh/vgpu-cores": "100",
            "volcano.sh/vgpu-memory": "1000",
        }
    },
}
_SHARE_NODE = {
    "metadata": {"name": "node-a"},
    "status": {"capacity": {"volcano.sh/gpu-memory": "2000", "volcano.sh/gpu-number": "2"}},
}


@FUZZ
@given(pods, COMPATS, st.sampled_from(["", "binpack", "spread"]))
def test_fits_of_any_pod(pod: Any, compat: Any, policy: str) -> None:
    """A pod fitted against well-formed nodes: its requests and annotations are the input."""

    def vgpu() -> object:
        gpus = vgpu_gpus(_VGPU_NODE, compat=compat)
        add_vgpu_pod(gpus, pod, compat)
        return fit_vgpu(gpus, parse_vgpu_requests(pod, compat=compat), pod, policy, compat)

    def share() -> object:
        cards = gpushare_cards(_SHARE_NODE, compat=compat)
        add_gpushare_pod(cards, pod, compat)
        return fit_gpushare(cards, pod, strategy="share", policy=policy, compat=compat)

    value_or_fit_error(vgpu)
    value_or_fit_error(share)


@FUZZ
@given(nodes, st.lists(pods, max_size=3), COMPATS)
def test_node_readers(node: Any, booked: list[Any], compat: Any) -> None:
    value_or_fit_error(lambda: vgpu_gpus(node, booked, compat=compat))
    value_or_fit_error(lambda: gpushare_cards(node, booked, compat=compat))
