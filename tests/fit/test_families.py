"""The scheduler-side device-family registry: one family per strategy, nothing else."""

from __future__ import annotations

import pytest

from deviceplugin.fit import STRATEGY_RESOURCES, ConfigError
from deviceplugin.fit.families import FAMILIES, family_of
from deviceplugin.fit.keys import STRATEGIES


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_strategy_has_its_family(strategy: str) -> None:
    family = family_of(strategy)
    assert family.strategy == strategy
    assert family.resources == STRATEGY_RESOURCES[strategy]


def test_the_registry_holds_exactly_the_strategies() -> None:
    assert sorted(FAMILIES) == sorted(STRATEGIES)


@pytest.mark.parametrize("name", ["", "Share", "mig", "gpu-number"])
def test_an_unknown_strategy_is_a_config_error_naming_it(name: str) -> None:
    with pytest.raises(ConfigError, match=f"not {name!r}"):
        family_of(name)
