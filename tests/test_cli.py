"""The `deviceplugin` command as a user runs it (a real subprocess)."""

from __future__ import annotations

import subprocess
import sys


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


def test_flags_without_a_command_run_the_daemon_as_the_upstream_daemonsets_pass_them() -> None:
    done = run("--gpu-strategy=bogus")
    assert done.returncode == 2
    assert done.stderr.startswith("deviceplugin run:") and "gpu-strategy" in done.stderr


def test_unknown_command_is_rejected() -> None:
    done = run("frobnicate")
    assert done.returncode == 2
    assert "invalid choice" in done.stderr
