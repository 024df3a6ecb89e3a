"""What each node family publishes on its Node, in process (the daemons the end-to-end tests start
run this code in other processes): the strategy label, the memory factor where a resource counts
memory units, the unhealthy GPUs or the vGPU register, the GPU count a share node's status carries."""

from __future__ import annotations

import pytest

from deviceplugin.fit import keys
from deviceplugin.fit.errors import ConfigError
from deviceplugin.gpu.base import GpuInfo
from deviceplugin.kube.node import NodeState
from deviceplugin.plugin.devices import Layout
from deviceplugin.plugin.families import node_family_of

GPUS = (
    GpuInfo(index=0, uuid="GPU-a", model="A10", memory_mib=16000),
    GpuInfo(index=1, uuid="GPU-b", model="A10", memory_mib=16000),
)
SECOND_DOWN = {"GPU-a": True, "GPU-b": False}
ALL_UP = {"GPU-a": True, "GPU-b": True}


def test_a_number_node_publishes_its_label_and_unhealthy_gpus_and_no_memory_factor() -> None:
    state = node_family_of("number").node_state(GPUS, SECOND_DOWN, Layout(factor=4))
    assert state == NodeState(
        annotations={keys.GPU_UNHEALTHY_IDS: "1"}, resources={}, labels={keys.GPU_STRATEGY_LABEL: "number"}
    )


def test_a_share_node_publishes_the_memory_factor_and_its_gpu_count() -> None:
    state = node_family_of("share").node_state(GPUS, SECOND_DOWN, Layout(factor=4))
    assert state == NodeState(
        annotations={keys.GPU_UNHEALTHY_IDS: "1", keys.GPU_MEMORY_FACTOR: "4"},
        resources={keys.GPU_NUMBER: "2"},
        labels={keys.GPU_STRATEGY_LABEL: "share"},
    )


@pytest.mark.parametrize("strategy", ["number", "share"])
def test_every_unhealthy_gpu_is_listed_and_one_without_a_health_record_counts_as_unhealthy(
    strategy: str,
) -> None:
    state = node_family_of(strategy).node_state(GPUS, {"GPU-a": False}, Layout())
    assert state.annotations[keys.GPU_UNHEALTHY_IDS] == "0,1"


def test_a_vgpu_gpu_without_a_health_record_registers_unhealthy() -> None:
    state = node_family_of("vgpu").node_state(GPUS, {"GPU-a": True}, Layout())
    assert state.annotations[keys.NODE_VGPU_REGISTER] == (
        "GPU-a,10,16000,NVIDIA-A10,true,hami-core:GPU-b,10,16000,NVIDIA-A10,false,hami-core:"
    )


@pytest.mark.parametrize("strategy", ["number", "share"])
def test_with_every_gpu_healthy_the_unhealthy_key_is_removed(strategy: str) -> None:
    state = node_family_of(strategy).node_state(GPUS, ALL_UP, Layout())
    assert state.annotations[keys.GPU_UNHEALTHY_IDS] is None  # None: the key is removed from the Node


def test_a_vgpu_node_registers_every_gpu_as_volcano_reads_it() -> None:
    layout = Layout(factor=2, split_count=7, memory_scaling=1.5)
    state = node_family_of("vgpu").node_state(GPUS, SECOND_DOWN, layout)
    # memory: 16000 MiB x 1.5 in units of 2 MiB; health per GPU; HAMi-core mode
    register = "GPU-a,7,12000,NVIDIA-A10,true,hami-core:GPU-b,7,12000,NVIDIA-A10,false,hami-core:"
    assert state == NodeState(
        annotations={keys.NODE_VGPU_REGISTER: register, keys.GPU_MEMORY_FACTOR: "2"},
        resources={},
        labels={keys.GPU_STRATEGY_LABEL: "vgpu"},
    )


@pytest.mark.parametrize(
    ("strategy", "resources", "hook", "handshake"),
    [
        ("number", [keys.GPU_NUMBER], False, False),
        ("share", [keys.GPU_MEMORY], False, False),
        ("vgpu", [keys.VGPU_NUMBER, keys.VGPU_MEMORY, keys.VGPU_CORES], True, True),
    ],
)
def test_each_family_serves_its_resources_and_only_vgpu_uses_the_hook_and_handshake(
    strategy: str, resources: list[str], hook: bool, handshake: bool
) -> None:
    family = node_family_of(strategy)
    assert family.strategy == strategy
    assert [resource.name for resource in family.resources] == resources
    assert (family.uses_hook, family.answers_handshake) == (hook, handshake)


def test_an_unknown_strategy_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"share, number, vgpu.*'mig'"):
        node_family_of("mig")
