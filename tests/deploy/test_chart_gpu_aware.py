"""The chart's `gpuAware` values reach the extender's gpu-aware weights (docs/gpu-aware.md), read
back with the extender's own config code; off by default, a negative weight refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin.fit.fragment import Weights
from tests.deploy.test_chart import HELM, extender_config_for, refusal, template
from tests.tools import missing

pytestmark = pytest.mark.skipif(HELM is None, reason=missing("helm"))


def test_gpu_aware_is_off_by_default(tmp_path: Path) -> None:
    extender, _ = extender_config_for(template({}, tmp_path), tmp_path)
    assert extender.gpu_aware == Weights()


def test_gpu_aware_values_reach_the_extender(tmp_path: Path) -> None:
    docs = template({"gpuAware": {"weight": 0.5, "lossWeight": 2}}, tmp_path)
    extender, _ = extender_config_for(docs, tmp_path)
    assert extender.gpu_aware == Weights(0.5, 2.0)


def test_a_negative_gpu_aware_weight_is_refused_by_name(tmp_path: Path) -> None:
    assert "gpuAware/lossWeight" in refusal({"gpuAware": {"lossWeight": -1}}, tmp_path)
