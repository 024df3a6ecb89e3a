"""The `deviceplugin` command as a user runs it (a real subprocess)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deviceplugin.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_help_lists_every_subcommand() -> None:
    done = run("--help")
    assert done.returncode == 0
    for command in ("run", "simulate", "extender", "inspect", "sim"):
        assert command in done.stdout


def test_simulate_plays_the_documented_examples() -> None:
    done = run("simulate")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "share-a -> volcano.sh/gpu-index: 0" in done.stdout
    assert "share-b -> volcano.sh/gpu-index: 0" in done.stdout
    assert "binpack: chosen GPU: GPU-demo-0" in done.stdout
    assert "spread: chosen GPU: GPU-demo-1" in done.stdout
    assert "BAD" not in done.stdout
    assert done.stdout.rstrip().endswith("all decisions as documented")


@pytest.mark.parametrize("command", ["extender", "inspect"])
def test_commands_not_yet_built_say_so(command: str) -> None:
    done = run(command)
    assert done.returncode == 2
    assert f"deviceplugin {command}: not available in this build yet" in done.stderr


def test_unknown_command_is_rejected() -> None:
    done = run("frobnicate")
    assert done.returncode == 2
    assert "invalid choice" in done.stderr
