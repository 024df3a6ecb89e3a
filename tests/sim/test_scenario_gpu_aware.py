"""A scenario's scheduler ConfigMap sets the extenders' gpu-aware score (issue 17 item 6): the
`gpu-aware` plugin's arguments `weight` and `loss.weight` are read as the extender reads
`--gpu-aware-weight` / `--gpu-aware-loss-weight`; a malformed one is a scenario error naming the
key. examples/gpu-aware-fragmentation.yaml shows the weights reaching the extenders' scores."""

from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin.fit.fragment import Weights
from kubesim.scenario import Scenario, read_scenario
from kubesim.workloads import ScenarioError

POD = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, image: i}]}\n"


def configmap(plugins: str) -> str:
    conf = "    tiers:\n    - plugins:\n" + "".join(f"      {line}\n" for line in plugins.splitlines())
    return (
        "kind: ConfigMap\napiVersion: v1\nmetadata: {name: volcano-scheduler-configmap}\n"
        f"data:\n  volcano-scheduler.conf: |\n{conf}" + POD
    )


def read(tmp_path: Path, text: str) -> Scenario:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return read_scenario(path)


def test_the_gpu_aware_plugin_arguments_set_the_weights(tmp_path: Path) -> None:
    scenario = read(
        tmp_path,
        configmap(
            "- name: deviceshare\n  arguments: {deviceshare.SchedulePolicy: binpack}\n"
            "- name: gpu-aware\n  arguments: {weight: 0.5, loss.weight: 2, other: 1}"
        ),
    )
    assert scenario.gpu_aware == Weights(weight=0.5, loss_weight=2.0)
    assert scenario.policy == "binpack"
    # an argument the extender has no option for is shown, not dropped silently
    notes = scenario.not_simulated
    assert "ConfigMap volcano-scheduler-configmap: gpu-aware argument other: 1" in notes


def test_without_the_plugin_the_score_stays_off(tmp_path: Path) -> None:
    scenario = read(
        tmp_path, configmap("- name: deviceshare\n  arguments: {deviceshare.SchedulePolicy: spread}")
    )
    assert not scenario.gpu_aware.on
    assert not read(tmp_path, POD).gpu_aware.on


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (
            "{loss.weight: heavy}",
            "gpu-aware.arguments loss.weight: --gpu-aware-loss-weight: invalid value 'heavy': must be a "
            "number",
        ),
        (
            "{weight: -1}",
            "gpu-aware.arguments weight: --gpu-aware-weight: invalid value -1: must be 0 or more",
        ),
        (
            "{loss.weight: true}",
            "gpu-aware.arguments loss.weight: --gpu-aware-loss-weight: invalid value True",
        ),
        (
            "{weight: 5000}",
            "gpu-aware.arguments weight: --gpu-aware-weight: invalid value 5000: must be at most 1000",
        ),
        ("{loss.weight: null}", "gpu-aware.arguments loss.weight: no value; it takes a number from 0 (off)"),
        ("[2]", "gpu-aware.arguments must be a mapping"),
    ],
)
def test_a_malformed_weight_is_an_error_naming_the_key(tmp_path: Path, arguments: str, error: str) -> None:
    with pytest.raises(ScenarioError) as raised:
        read(tmp_path, configmap(f"- name: gpu-aware\n  arguments: {arguments}"))
    assert "document 1: tiers[0] " in str(raised.value)
    assert error in str(raised.value)
