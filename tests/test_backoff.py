"""The back-off policy and a loop's run of failures: pure arithmetic, no clock."""

from __future__ import annotations

import pytest

from deviceplugin.backoff import Backoff, Retries


def test_the_delay_multiplies_with_every_failure_in_a_row_up_to_its_cap() -> None:
    backoff = Backoff(start_s=0.2, max_s=30.0)
    assert [backoff.delay(n) for n in range(1, 10)] == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0]
    assert backoff.delay(10_000) == 30.0  # no overflow however long the run
    triple = Backoff(start_s=1.0, max_s=100.0, factor=3.0)
    assert [triple.delay(n) for n in (1, 2, 3, 4, 5)] == [1, 3, 9, 27, 81]


def test_a_run_of_failures_backs_off_and_a_success_starts_it_again() -> None:
    retries = Retries(Backoff(start_s=0.5, max_s=2.0))
    assert [retries.failed() for _ in range(4)] == [0.5, 1.0, 2.0, 2.0]
    retries.succeeded()
    assert retries.failed() == 0.5


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"start_s": 0.0, "max_s": 1.0}, "start_s"),
        ({"start_s": -1.0, "max_s": 1.0}, "start_s"),
        ({"start_s": 2.0, "max_s": 1.0}, "max_s"),
        ({"start_s": 1.0, "max_s": 2.0, "factor": 0.5}, "factor"),
        ({"start_s": float("nan"), "max_s": 1.0}, "start_s"),
    ],
)
def test_a_policy_that_would_not_back_off_is_refused_naming_the_field(
    fields: dict[str, float], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        Backoff(**fields)
