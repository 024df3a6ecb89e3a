"""The node-side device families: one per strategy, serving what the scheduler side fits."""

from __future__ import annotations

import pytest

from deviceplugin.fit import ConfigError, keys
from deviceplugin.fit.families import family_of
from deviceplugin.fit.keys import STRATEGIES
from deviceplugin.plugin.families import NODE_FAMILIES, node_family_of


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_node_serves_what_the_scheduler_fits(strategy: str) -> None:
    node = node_family_of(strategy)
    assert node.strategy == strategy
    advertised = {resource.name for resource in node.resources}
    # The memory percentage is read from the pod's limits alone: no plugin advertises it.
    assert advertised == set(family_of(strategy).resources) - {keys.VGPU_MEMORY_PERCENTAGE}


def test_the_registry_holds_exactly_the_strategies() -> None:
    assert sorted(NODE_FAMILIES) == sorted(STRATEGIES)


def test_an_unknown_strategy_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="not 'mig'"):
        node_family_of("mig")
