"""Every interval, period and timeout of the daemon has a floor and a ceiling, and a value outside is
a configuration error naming the option (issue 13: 1e-9 s was accepted and busy-polled a CPU; a
value past the platform's timed waits would raise OverflowError in the worker that waits on it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deviceplugin.config import OPTIONS, load_config
from deviceplugin.options import OptionError

# option -> (shortest accepted, longest accepted, what a value above the longest is told)
BOUNDS = {
    "vgpu-handshake-interval": (0.1, 59.999, "must be below 60"),
    "node-resync-interval": (0.1, 86400.0, "must be at most 86400"),
    "health-recovery-period": (0.1, 86400.0, "must be at most 86400"),
    "allocate-timeout": (0.1, 60.0, "must be at most 60"),
    "reconcile-interval": (0.1, 86400.0, "must be at most 86400"),
    "release-grace-period": (0.1, 86400.0, "must be at most 86400"),
}


# every option that takes a time, known here or added later
TIMED = sorted(o.name for o in OPTIONS if o.name.endswith(("-interval", "-period", "-timeout")))


def load(option: str, value: str) -> object:
    flags: dict[str, str | None] = {"node-name": "n1", option: value}
    if option.startswith("vgpu-"):
        flags["gpu-strategy"] = "vgpu"
    return getattr(load_config(flags, {}), option.replace("-", "_"))


def test_the_options_with_known_bounds_exist() -> None:
    assert set(BOUNDS) <= set(TIMED)


@pytest.mark.parametrize("option", TIMED)
def test_every_time_option_refuses_a_busy_poll_and_an_overflow(option: str) -> None:
    with pytest.raises(
        OptionError, match=rf"^--{option}: invalid value '1e-9': must be at least 0.1 seconds"
    ):
        load(option, "1e-9")
    with pytest.raises(OptionError, match=rf"^--{option}: invalid value '1e12': must be (at most|below) "):
        load(option, "1e12")


@pytest.mark.parametrize("option", list(BOUNDS))
def test_the_bounds_themselves_are_accepted(option: str) -> None:
    low, high, _ = BOUNDS[option]
    assert load(option, str(low)) == low
    assert load(option, str(high)) == high


@pytest.mark.parametrize("option", list(BOUNDS))
@pytest.mark.parametrize("value", ["1e-9", "0.099", "0", "-1", "nan", "inf"])
def test_too_short_or_not_a_number_names_the_option(option: str, value: str) -> None:
    with pytest.raises(OptionError, match=rf"^--{option}: invalid value '{value}': must be"):
        load(option, value)


@pytest.mark.parametrize("option", list(BOUNDS))
def test_too_long_names_the_option(option: str) -> None:
    _, high, told = BOUNDS[option]
    for value in (str(high + 1), "1e12"):
        with pytest.raises(OptionError, match=rf"^--{option}: invalid value '{value}': {told}"):
            load(option, value)


def test_the_daemon_refuses_a_busy_poll_interval_at_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "deviceplugin.cli", "run", "--node-name", "n1", "--fake-gpus", "1x100"),
            *("--device-plugin-dir", str(tmp_path), "--state-dir", str(tmp_path / "state")),
            *("--metrics-address", "127.0.0.1:0", "--reconcile-interval", "1e-9"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "--reconcile-interval: invalid value '1e-9': must be at least 0.1" in done.stderr
