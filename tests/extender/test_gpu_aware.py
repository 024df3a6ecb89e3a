"""The gpu-aware node score (docs/gpu-aware.md) over HTTP: with `loss.weight` on, prioritize
ranks first the node where the pod breaks the least usable capacity (an NVLink island, whole
GPUs); off, the scores are today's; its configuration errors name the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deviceplugin.extender import ExtenderConfigError, load_config
from deviceplugin.fit import keys
from deviceplugin.fit.fragment import Weights
from deviceplugin.fit.topology import TOPOLOGY_KEY, Link, Topology
from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import Obj, StartExtender, create_pod, gpu_pod, gpu_uuid, share_node, vgpu_node
from tests.extender.test_whole import whole_node

AWARE = {"gpu_aware_loss_weight": 2.0}  # the setting docs/gpu-aware.md recommends
# Whole-GPU strategies: the resource a pod asks, and a node of 8 GPUs as its plugin publishes it.
WHOLE = {"number": "volcano.sh/gpu-number", "whole": keys.NVIDIA_GPU}


def islands(a: int, b: int) -> Link:
    """Two 4-card NVLink islands (GPUs 0-3 and 4-7), SYS between them."""
    return Link("NV", 4) if a // 4 == b // 4 else Link("SYS")


def island_node(name: str, strategy: str) -> Obj:
    node = (
        whole_node(name, gpus=8) if strategy == "whole" else share_node(name, gpus=8, memory_resource=False)
    )
    node["metadata"]["annotations"][TOPOLOGY_KEY] = Topology.build(
        range(8), [0] * 4 + [1] * 4, islands
    ).encode()
    return node


def hold(apiserver: ApiServerEmulator, strategy: str, node: str, gpus: str) -> None:
    """A running pod on `node` holding the cards `gpus` ("4,5,6,7")."""
    limits = {WHOLE[strategy]: str(len(gpus.split(",")))}
    name = f"holds-{node}-{gpus.replace(',', '-')}"
    create_pod(apiserver, gpu_pod(name, limits, node=node, annotations={"volcano.sh/gpu-index": gpus}))


def island_cluster(apiserver: ApiServerEmulator, strategy: str = "number") -> Obj:
    """Two 8-GPU nodes with 4 idle GPUs each: `island` keeps a whole NVLink island (0-3),
    `halves` two halves of islands (0, 1 and 4, 5). Binpack rates them alike."""
    apiserver.create("nodes", island_node("island", strategy))
    apiserver.create("nodes", island_node("halves", strategy))
    hold(apiserver, strategy, "island", "4,5,6,7")
    hold(apiserver, strategy, "halves", "2,3,6,7")
    return create_pod(apiserver, gpu_pod("new", {WHOLE[strategy]: "1"}))


NODES = ["island", "halves"]


@pytest.mark.parametrize("strategy", sorted(WHOLE))
def test_a_one_gpu_pod_goes_where_it_breaks_no_nvlink_island(
    apiserver: ApiServerEmulator, start_extender: StartExtender, strategy: str
) -> None:
    pod = island_cluster(apiserver, strategy)
    today = start_extender(strategy=strategy).client
    aware = start_extender(strategy=strategy, **AWARE).client
    assert today.filter(pod, NODES)["NodeNames"] == NODES
    assert aware.filter(pod, NODES)["NodeNames"] == NODES

    assert today.prioritize(pod, NODES) == {"island": 6, "halves": 6}
    # keep: island 100 x (1 - 1.75/8), halves 100 x (1 - 0.75/8); (62.5 + 2 keep) / 3
    assert aware.prioritize(pod, NODES) == {"island": 7, "halves": 8}


def test_the_score_follows_the_node_after_a_bind(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """A kept score is for the node as it was: a bind there changes the next pod's score."""
    pod = island_cluster(apiserver)
    aware = start_extender(strategy="number", **AWARE).client
    aware.filter(pod, NODES)
    assert aware.prioritize(pod, NODES) == {"island": 7, "halves": 8}
    assert aware.bind(pod, "halves") == ""

    again = create_pod(apiserver, gpu_pod("again", {WHOLE["number"]: "1"}))
    aware.filter(again, NODES)
    # halves: idle 1, 4, 5 -> 4, 5 (loss 0.25), binpack 75: (75 + 2 x 96.875) / 3
    assert aware.prioritize(again, NODES) == {"island": 7, "halves": 9}


def whole_card_cluster(apiserver: ApiServerEmulator) -> Obj:
    """vgpu: `one` has one idle card of 4, `pair` two; a whole-card pod scores 100 on both."""
    for name, held in (("one", 3), ("pair", 2)):
        apiserver.create("nodes", vgpu_node(name, gpus=4, memory=16000))
        for index in range(held):
            notes = {"volcano.sh/vgpu-ids-new": f"{gpu_uuid(name, index)},NVIDIA,16000,0:"}
            limits = {"volcano.sh/vgpu-number": "1"}
            create_pod(apiserver, gpu_pod(f"{name}-{index}", limits, node=name, annotations=notes))
    return create_pod(apiserver, gpu_pod("new", {"volcano.sh/vgpu-number": "1"}))


def test_a_whole_card_pod_goes_where_it_leaves_an_idle_pair(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    pod = whole_card_cluster(apiserver)
    today = start_extender(strategy="vgpu").client
    aware = start_extender(strategy="vgpu", **AWARE).client
    nodes = ["one", "pair"]
    assert today.filter(pod, nodes)["NodeNames"] == nodes
    assert today.prioritize(pod, nodes) == {"one": 10, "pair": 10}
    aware.filter(pod, nodes)
    # one: loss 0.4 (its last card and that card's share), pair: 0.8 (a 2-GPU block too)
    assert aware.prioritize(pod, nodes) == {"one": 10, "pair": 9}


@pytest.mark.parametrize(
    "options",
    [{}, {"gpu_aware_weight": 0.0, "gpu_aware_loss_weight": 0.0}],
    ids=["default", "weights-0"],
)
def test_off_the_scores_are_todays(
    apiserver: ApiServerEmulator, start_extender: StartExtender, options: dict[str, Any]
) -> None:
    pod = island_cluster(apiserver)
    running = start_extender(strategy="number", **options)
    assert running.extender.config.gpu_aware == Weights()
    assert running.client.prioritize(pod, NODES) == {"island": 6, "halves": 6}


def test_compat_volcano_keeps_volcanos_scores_even_when_given_weights(
    apiserver: ApiServerEmulator, start_extender: StartExtender
) -> None:
    """In process the config is not checked: the service itself leaves the score out."""
    pod = whole_card_cluster(apiserver)
    nodes = ["one", "pair"]
    volcano = start_extender(strategy="vgpu", compat="volcano").client
    given = start_extender(strategy="vgpu", compat="volcano", **AWARE).client
    assert given.prioritize(pod, nodes) == volcano.prioritize(pod, nodes)


# --- configuration --------------------------------------------------------------------------


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "extender.yaml"
    path.write_text(text)
    return str(path)


def test_the_seed_plugins_arguments_and_the_flags_set_the_weights(tmp_path: Path) -> None:
    section = _file(tmp_path, "gpu-aware:\n  weight: 0.5\n  loss.weight: 2\n")
    assert load_config({"config": section}, env={}).gpu_aware == Weights(0.5, 2.0)
    flag_wins = load_config({"config": section, "gpu-aware-loss-weight": "3"}, env={})
    assert flag_wins.gpu_aware == Weights(0.5, 3.0)
    assert load_config({}, env={}).gpu_aware == Weights()
    assert not Weights().on


@pytest.mark.parametrize(
    ("text", "flags", "expected"),
    [
        (
            "gpu-aware:\n  loss.weight: -1\n",
            {},
            r"--gpu-aware-loss-weight \(from .*extender.yaml gpu-aware.loss.weight\): invalid value -1: "
            r"must be 0 or more",
        ),
        ("", {"gpu-aware-weight": "-0.5"}, r"--gpu-aware-weight: invalid value '-0.5': must be 0 or more"),
        (
            "gpu-aware:\n  weight: heavy\n",
            {},
            r"--gpu-aware-weight \(from .*gpu-aware.weight\): invalid value 'heavy': must be a number",
        ),
        ("gpu-aware:\n  weight: true\n", {}, r"gpu-aware.weight\): invalid value True: must be a number"),
        (
            "",
            {"gpu-aware-weight": "nan"},
            r"--gpu-aware-weight: invalid value 'nan': must be a finite number",
        ),
        (
            "gpu-aware:\n  loss-weight: 2\n",
            {},
            r"unknown option\(s\) gpu-aware.loss-weight \(known: gpu-aware.weight, gpu-aware.loss.weight\)",
        ),
        ("gpu-aware: 2\n", {}, r"gpu-aware must be a mapping of weight, loss.weight, not int"),
        (
            "gpu-aware-weight: 1\ngpu-aware:\n  weight: 2\n",
            {},
            r"gpu-aware-weight is given both as gpu-aware-weight and in the gpu-aware section",
        ),
        (
            "compat: volcano\ngpu-aware:\n  loss.weight: 2\n",
            {},
            r"--gpu-aware-loss-weight \(from .*gpu-aware.loss.weight\): the gpu-aware score is this "
            r"project's, not Volcano's",
        ),
    ],
    ids=[
        "negative",
        "negative-flag",
        "not-a-number",
        "boolean",
        "nan",
        "unknown-key",
        "not-a-section",
        "twice",
        "compat-volcano",
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, flags: dict[str, str], expected: str) -> None:
    with pytest.raises(ExtenderConfigError, match=expected):
        load_config({"config": _file(tmp_path, text), **flags}, env={})
