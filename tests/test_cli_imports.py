"""What `deviceplugin` imports for each command (issue 14 item 2): `--help` and `run --help` load no
sub-command's code, and the daemon never loads the emulators (deviceplugin.sim) or their
dependency jsonpatch. Checked in a fresh interpreter: this test process has imported everything."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# The code of the sub-commands other than `run`, and the heavy libraries only some commands need.
EMULATORS = ("deviceplugin.sim", "jsonpatch")
OTHER_COMMANDS = ("deviceplugin.extender", "deviceplugin.inspect")
DAEMON = ("deviceplugin.runner", "deviceplugin.plugin", "kubernetes", "grpc", "prometheus_client")

_PROBE = """
import json, sys
from deviceplugin import cli
try:
    {action}
except SystemExit:
    pass
sys.stderr.write(json.dumps(sorted(sys.modules)))
"""


def loaded_after(action: str) -> set[str]:
    """The top-level names of the modules a fresh interpreter holds after `action`."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(action=action)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stderr.splitlines()[-1]))


def under(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"]], ids=" ".join)
def test_help_imports_no_sub_commands_code(argv: list[str]) -> None:
    loaded = loaded_after(f"cli.main({argv!r})")
    assert under(loaded, EMULATORS + OTHER_COMMANDS + DAEMON) == []


def test_building_the_parser_imports_no_sub_commands_code() -> None:
    loaded = loaded_after("cli.build_parser()")
    assert under(loaded, EMULATORS + OTHER_COMMANDS + DAEMON + ("deviceplugin.config", "yaml")) == []


def test_the_daemon_never_imports_the_emulators() -> None:
    """Everything `run` imports, up to the daemon's entry point (runner.run), with its flags parsed."""
    loaded = loaded_after(
        "cli.build_parser().parse_args(['run', '--node-name', 'n']); import deviceplugin.runner"
    )
    assert "deviceplugin.runner" in loaded  # the probe did reach the daemon's code
    assert under(loaded, EMULATORS + OTHER_COMMANDS) == []


def test_a_chosen_command_gets_its_options() -> None:
    """The other side of loading lazily: a command's options are there once it is chosen."""
    loaded = loaded_after(
        "args = cli.build_parser().parse_args(['extender', '--policy', 'spread'])\n"
        "    assert args.policy == 'spread', args"
    )
    assert "deviceplugin.extender" in loaded
    assert under(loaded, EMULATORS) == []
