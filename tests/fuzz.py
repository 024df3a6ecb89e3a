"""Hypothesis strategies for hostile annotations, quantities and Kubernetes objects.

A reader of cluster objects must answer any input with a value or a `FitInputError`: one pod with
a 4,301-digit annotation once killed a daemon's pod cache (issue 13). The strategies mix what
Volcano writes with what it never does: digit runs past Python's 4,300-digit `int()` limit, runs
that overflow int64 and then turn into junk, other scripts' digits, wrong JSON shapes at every
level. Objects are mostly well-shaped, so the fuzzing reaches the decoders behind the shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from deviceplugin.fit import FitInputError, keys

# Reproducible and quick in CI: a fixed derivation of examples, no example database, no deadline
# (a shared 2-core machine must not turn a slow example into a failure).
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def value_or_fit_error(call: Callable[[], object]) -> object:
    """The call's value, or None when it raised a FitInputError; any other exception fails."""
    try:
        return call()
    except FitInputError:
        return None


# --- text ------------------------------------------------------------------------------------

# Numbers around the bounds: int64's 19 digits, and int()'s 4,300 (padded with zeros or not).
digit_runs = st.builds(
    lambda digit, count, lead: "0" * lead + digit * count,
    st.sampled_from("1234567890"),
    st.sampled_from([1, 19, 20, 4301, 5000]),
    st.sampled_from([0, 30]),
)
long_digits = st.builds(
    lambda digit, count, lead: "0" * lead + digit * count,
    st.sampled_from("179"),
    st.sampled_from([4301, 5000]),
    st.sampled_from([0, 30]),
)
TOKENS = [",", ":", ";", "[", "]", "-", "+", ".", " ", "e", "E", "Gi", "Mi", "m", "n", "k", "x"]
TOKENS += [
    "true",
    "false",
    "hami-core",
    "mig",
    "mps",
    "NVIDIA",
    "GPU-a",
    "GPU-b",
    "g0",
    "\u0661",
    "\u00b2",
    "\x00",
]
tokens = st.one_of(digit_runs, st.sampled_from(TOKENS), st.text(max_size=3))
# One field of an annotation: mostly a number (long, signed, or overflowing into junk).
fields = st.one_of(
    long_digits,  # the killers, often
    digit_runs,
    digit_runs.map(lambda run: "-" + run),
    digit_runs.map(lambda run: run + "x"),
    st.lists(tokens, max_size=3).map("".join),
)


def _joined(parts: st.SearchStrategy[list[str]], separator: str, end: str = "") -> st.SearchStrategy[str]:
    return parts.map(lambda items: separator.join(items) + end)


def _either(usual: list[str]) -> st.SearchStrategy[str]:
    """A value Volcano writes, or a hostile field."""
    return st.one_of(st.sampled_from(usual), fields)


_uuids = st.one_of(
    st.sampled_from(["GPU-a", "GPU-b", "GPU-a[g0-1]"]), st.builds("GPU-a[g0-{}]".format, fields), fields
)
_device = st.builds(
    "{},{},{},{}:".format, _uuids, _either(["NVIDIA"]), _either(["1000", "0"]), _either(["10"])
)
_gpu = st.builds(
    "{},{},{},{},{},{}:".format,
    _either(["GPU-a", "GPU-b"]),
    _either(["10", "4"]),
    _either(["1000", "40960"]),
    _either(["NVIDIA-A100"]),
    _either(["true", "false"]),
    _either(["hami-core", "mig"]),
)
_entry4 = _joined(st.lists(fields, min_size=3, max_size=5), ",", ":")  # a device entry, odd field count
_entry6 = _joined(st.lists(fields, min_size=4, max_size=7), ",", ":")  # a GPU entry, odd field count
index_lists = st.one_of(
    st.sampled_from(["0", "1", "0,1"]),
    _joined(st.lists(_either(["0", "1", "2"]), min_size=1, max_size=4), ","),
)
pod_devices = st.one_of(
    st.sampled_from(["GPU-a,NVIDIA,100,10:", "GPU-a[g0-1],NVIDIA,100,0:;GPU-b,NVIDIA,5,5:"]),
    _joined(
        st.lists(_joined(st.lists(st.one_of(_device, _device, _entry4), max_size=3), ""), max_size=3), ";"
    ),
)
registers = st.one_of(
    st.sampled_from(
        ["GPU-a,10,1000,NVIDIA-A100,true,hami-core:", "GPU-a,4,1000,T4,true,mig:GPU-b,10,2000,A,1,mig:"]
    ),
    _joined(st.lists(st.one_of(_gpu, _gpu, _entry6), min_size=1, max_size=3), ""),
)
# Annotation-like text: the codecs' shapes with hostile fields, and token soup.
codec_text = st.one_of(
    index_lists,
    pod_devices,
    registers,
    _uuids,
    st.lists(tokens, max_size=24).map("".join),
    st.text(max_size=40),
)

quantity_text = st.one_of(
    st.sampled_from(["0", "1", "2", "10", "1000", "3Gi", "500m", "1.5", "-1", "1e3"]),
    st.lists(
        st.one_of(digit_runs, st.sampled_from(["-", "+", ".", "e", "e-", "E+", "Gi", "m", "Ei"])), max_size=5
    ).map("".join),
    st.sampled_from(["1e999999999", "1e-999999999", "9e2147483647", "1e9223372036854775808", "0e999999999"]),
)
quantities = st.one_of(
    quantity_text,
    quantity_text,
    st.integers(min_value=-(10**80), max_value=10**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)

# --- JSON-ish objects ------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8), codec_text)
junk = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


ANNOTATIONS = {
    keys.GPU_INDEX: index_lists,
    keys.PREDICATE_TIME: _either(["1700000000000000000"]),
    keys.GPU_ASSIGNED: _either(["true", "false"]),
    keys.VGPU_NODE: _either(["node-a"]),
    keys.VGPU_TIME: _either(["1700000000"]),
    keys.VGPU_IDS_NEW: pod_devices,
    keys.DEVICES_TO_ALLOCATE: pod_devices,
    keys.BIND_PHASE: _either(["allocating", "success", "failed"]),
    keys.VGPU_MODE: _either(["hami-core", "mig"]),
    keys.VGPU_USE_UUID: _either(["GPU-a", "GPU-a,GPU-b"]),
    keys.VGPU_NOUSE_UUID: _either(["GPU-b"]),
    keys.VGPU_PODGROUP_POLICY: _either(["spread"]),
    keys.USE_GPUTYPE: _either(["A100", "a100,"]),
    keys.NOUSE_GPUTYPE: _either(["T4"]),
    keys.KUBE_GROUP_NAME: _either(["g1"]),
}
NODE_ANNOTATIONS = {
    keys.NODE_VGPU_REGISTER: registers,
    keys.GPU_UNHEALTHY_IDS: index_lists,
    keys.GPU_MEMORY_FACTOR: _either(["1", "1024"]),
}
RESOURCES = [
    keys.GPU_MEMORY,
    keys.GPU_NUMBER,
    keys.VGPU_NUMBER,
    keys.VGPU_MEMORY,
    keys.VGPU_MEMORY_PERCENTAGE,
    keys.VGPU_CORES,
]


def _values(entries: dict[str, st.SearchStrategy[str]], odd: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Any subset of the annotations; odd: values that are not strings (only an object that did
    not come from an API server has them, and the readers must still say so)."""
    if odd:
        return st.dictionaries(st.sampled_from(sorted(entries)), junk, min_size=1, max_size=2)
    return st.fixed_dictionaries({}, optional=entries)


usual_quantities = st.one_of(*[st.sampled_from(["1", "2", "10", "1000"])] * 3, quantities)


def _capacities(*names: str) -> st.SearchStrategy[dict[str, Any]]:
    """A node's capacity or allocatable for its resources: mostly plain counts."""
    return st.fixed_dictionaries(dict.fromkeys(names, usual_quantities))


# A node's annotations: its registration, and any of the others.
_registered = st.fixed_dictionaries(
    {keys.NODE_VGPU_REGISTER: registers},
    optional={key: value for key, value in NODE_ANNOTATIONS.items() if key != keys.NODE_VGPU_REGISTER},
)


def _objects(odd: bool) -> tuple[st.SearchStrategy[dict[str, Any]], st.SearchStrategy[dict[str, Any]]]:
    """(pods, nodes), Kubernetes-shaped with hostile values; odd: any level may be any JSON."""

    def shaped(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(good, junk) if odd else good

    resource_lists = st.dictionaries(st.sampled_from(RESOURCES), usual_quantities, min_size=1, max_size=4)
    resources = st.fixed_dictionaries(
        {"limits": shaped(resource_lists)}, optional={"requests": shaped(resource_lists)}
    )
    containers = shaped(
        st.fixed_dictionaries(
            {"name": shaped(st.sampled_from(["a", "b", "c"])), "resources": shaped(resources)},
            optional={"env": junk},
        )
    )
    metadata = st.fixed_dictionaries(
        {
            "name": st.sampled_from(["p", "q"]),
            "namespace": st.just("ml"),
            "uid": st.sampled_from(["u1", "u2"]),
            "annotations": shaped(_values(ANNOTATIONS, odd)),
        },
        optional={
            "labels": shaped(st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)),
            "deletionTimestamp": junk,
            "creationTimestamp": junk,
        },
    )
    spec = st.fixed_dictionaries(
        {"nodeName": shaped(st.just("node-a")), "containers": shaped(st.lists(containers, max_size=3))},
        optional={"initContainers": shaped(st.lists(containers, max_size=2))},
    )
    status = st.fixed_dictionaries({"phase": shaped(st.sampled_from(["Running", "Failed"]))})
    pods = st.fixed_dictionaries(
        {"metadata": shaped(metadata), "spec": shaped(spec)}, optional={"status": shaped(status)}
    )
    node_annotations = _values(NODE_ANNOTATIONS, odd) if odd else _registered
    node_metadata = st.fixed_dictionaries(
        {"name": st.just("node-a"), "annotations": shaped(node_annotations)}
    )
    node_status = st.fixed_dictionaries(
        {
            "capacity": shaped(_capacities(keys.GPU_MEMORY, keys.GPU_NUMBER)),
            "allocatable": shaped(_capacities(keys.VGPU_NUMBER, keys.VGPU_CORES, keys.VGPU_MEMORY)),
        }
    )
    nodes = st.fixed_dictionaries({"metadata": shaped(node_metadata), "status": shaped(node_status)})
    return pods, nodes


_VALID_LIMITS = [
    {keys.VGPU_NUMBER: "1", keys.VGPU_MEMORY: "100"},
    {keys.VGPU_NUMBER: "2", keys.VGPU_CORES: "10"},
    {keys.GPU_MEMORY: "100"},
    {keys.GPU_NUMBER: "1"},
]
# Everything Volcano writes, but the annotations: these reach the booking and serving paths.
annotated_pods = st.builds(
    lambda notes, limits, phase: {
        "metadata": {"name": "p", "namespace": "ml", "uid": "u1", "annotations": notes},
        "spec": {"nodeName": "node-a", "containers": [{"name": "a", "resources": {"limits": limits}}]},
        "status": {"phase": phase},
    },
    st.one_of(st.fixed_dictionaries(ANNOTATIONS), _values(ANNOTATIONS, odd=True)),
    st.sampled_from(_VALID_LIMITS),
    st.sampled_from(["Running", "Pending"]),
)
annotated_nodes = st.builds(
    lambda notes: {
        "metadata": {"name": "node-a", "annotations": notes},
        "status": {
            "capacity": {keys.GPU_MEMORY: "2000", keys.GPU_NUMBER: "2"},
            "allocatable": {keys.VGPU_NUMBER: "20", keys.VGPU_CORES: "200", keys.VGPU_MEMORY: "3000"},
        },
    },
    st.one_of(st.fixed_dictionaries(NODE_ANNOTATIONS), _values(NODE_ANNOTATIONS, odd=True)),
)
_shaped_pods, _shaped_nodes = _objects(odd=False)
_odd_pods, _odd_nodes = _objects(odd=True)
pods = st.one_of(annotated_pods, _shaped_pods, _odd_pods)
nodes = st.one_of(annotated_nodes, _shaped_nodes, _odd_nodes)
