"""What `deviceplugin` imports for each command (issue 14 item 2): `--help` and `run --help` load no
sub-command's code, and the daemon never loads the emulators (kubesim) or their
dependency jsonpatch. Checked in a fresh interpreter: this test process has imported everything.
The emulators are their own distribution: no module of the product imports them, and `simulate`
without them says how to install them."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import deviceplugin

# The code of the sub-commands other than `run`, and the heavy libraries only some commands need.
EMULATORS = ("kubesim", "jsonpatch")
OTHER_COMMANDS = ("deviceplugin.extender", "deviceplugin.inspect")
# ... and the GPU backends and the fit rules: the run command's options read neither.
DAEMON: tuple[str, ...] = ("deviceplugin.runner", "deviceplugin.plugin", "kubernetes", "grpc")
DAEMON += ("prometheus_client", "pynvml", "deviceplugin.gpu.nvml", "deviceplugin.gpu.fake")
DAEMON += ("deviceplugin.fit.gpushare", "deviceplugin.fit.vgpu")

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


# What the daemon's start does not need before it registers with kubelet (bench/startup.py,
# issue 15 item 5): the metrics listener, the API client's HTTP stack, the YAML parser (a start
# with flags alone), the NVML bindings (fake GPUs here) and the scheduler-side fit families.
BEFORE_REGISTER: tuple[str, ...] = (
    "prometheus_client",
    "deviceplugin.metrics",
    "urllib3",
    "yaml",
    "kubernetes",
)
BEFORE_REGISTER += (
    "pynvml",
    "deviceplugin.gpu.nvml",
    "deviceplugin.fit.families",
    "deviceplugin.plugin.vgpu",
)


def test_the_daemon_loads_what_registering_needs_and_no_more() -> None:
    """The daemon's code up to its entry point, and the fake GPU backend it loads before Register."""
    loaded = loaded_after(
        "cli.build_parser().parse_args(['run', '--node-name', 'n']); import deviceplugin.runner\n"
        "    from deviceplugin.gpu.load import load_backend\n"
        "    load_backend('2x16384', None)\n"
        "    from deviceplugin.plugin.families import node_family_of\n"
        "    node_family_of('share')"
    )
    assert {"deviceplugin.runner", "deviceplugin.gpu.fake"} <= loaded  # the probe reached them
    assert under(loaded, BEFORE_REGISTER) == []


def test_a_chosen_command_gets_its_options() -> None:
    """The other side of loading lazily: a command's options are there once it is chosen."""
    loaded = loaded_after(
        "args = cli.build_parser().parse_args(['extender', '--policy', 'spread'])\n"
        "    assert args.policy == 'spread', args"
    )
    assert "deviceplugin.extender" in loaded
    assert under(loaded, EMULATORS) == []


def imported_by(path: Path) -> set[str]:
    """The modules `path` names in its import statements, wherever they stand."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_module_of_the_product_imports_the_emulators() -> None:
    """Not even inside a function: `simulate` and `sim` reach them through the CLI's loader, which
    tells how to install them when they are missing (the image has none)."""
    package = Path(deviceplugin.__file__).parent
    modules = sorted(package.rglob("*.py"))
    assert len(modules) > 50  # the walk did read the product
    found = {
        f"{path.relative_to(package.parent)}: {name}"
        for path in modules
        for name in under(imported_by(path), EMULATORS)
    }
    assert sorted(found) == []


# In place of an install without the emulators: the import system finds no `kubesim`.
_WITHOUT_EMULATORS = """
import sys
from deviceplugin import cli

class NoEmulators:
    def find_spec(self, name, path=None, target=None):
        if name == cli.EMULATORS:
            raise ModuleNotFoundError("No module named " + repr(name), name=name)
        return None

sys.meta_path.insert(0, NoEmulators())
sys.exit(cli.main({argv!r}))
"""


@pytest.mark.parametrize(
    "argv",
    [["simulate"], ["simulate", "--output", "json"], ["sim", "apiserver"], ["sim", "kubelet", "--dir", "d"]],
    ids=" ".join,
)
def test_emulator_commands_without_the_emulators_say_how_to_install_them(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EMULATORS.format(argv=argv)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"deviceplugin {argv[0]}: the emulators (package kubesim) are not installed; they are not part "
        "of the product: pip install -e ./emulators from a checkout of the repository"
    ]


def test_the_daemon_loads_the_kubernetes_client_only_once_registered() -> None:
    """`run` registers with kubelet before it loads its API client: the daemon's code imports no
    part of the kubernetes package (a quarter of a second of start-up, bench/startup.py)."""
    loaded = loaded_after("import deviceplugin.runner")
    assert under(loaded, ("deviceplugin.plugin.daemon",)) != []
    assert under(loaded, ("kubernetes",)) == []
