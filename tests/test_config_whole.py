"""The `whole` strategy's configuration (docs/whole.md): chosen like the others, and the vGPU-only
options refused on it naming the strategy that reads them."""

from __future__ import annotations

import pytest

from deviceplugin.config import load_config
from deviceplugin.options import OptionError
from tests.test_config import flags


def test_whole_is_a_strategy_by_flag_and_by_env() -> None:
    assert load_config(flags(node_name="n", gpu_strategy="whole"), {}).gpu_strategy == "whole"
    assert load_config(flags(node_name="n"), {"GPU_STRATEGY": "whole"}).gpu_strategy == "whole"


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("vgpu_mode", "mig"),
        ("vgpu_mode", "hami-core"),
        ("vgpu_memory_scaling", "2"),
        ("mps_root", "/srv/mps"),
    ],
)
def test_vgpu_options_are_refused_on_a_whole_node(option: str, value: str) -> None:
    name = option.replace("_", "-")
    with pytest.raises(
        OptionError, match=rf"--{name}: for --gpu-strategy vgpu only \(this node runs whole\)"
    ):
        load_config(flags(node_name="n", gpu_strategy="whole", **{option: value}), {})


def test_an_unknown_strategy_lists_whole_among_the_choices() -> None:
    with pytest.raises(OptionError, match=r"must be one of share, number, vgpu, whole"):
        load_config(flags(node_name="n", gpu_strategy="nvidia"), {})
