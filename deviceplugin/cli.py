"""Command line: `deviceplugin run | simulate | extender | inspect | sim`.

A command's code (and its options, where they live with it) is imported only when that command is
chosen: `deviceplugin --help` loads none of them, and the daemon never loads the emulators. The
emulators (`simulate`, `sim`) are not part of the product: they are the package kubesim of their own
distribution (emulators/ in the repository), absent from the product's wheel and image.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from deviceplugin import __version__

if TYPE_CHECKING:  # argparse's class is generic to type checkers only
    Commands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


class _Parser(argparse.ArgumentParser):
    """The parser of `deviceplugin` and, as argparse makes sub-commands' parsers of their parent's
    class, of every sub-command: help strings are plain text (argparse would read a `%` in one as a
    format and crash `--help`), and each command reports the arguments it does not know with its own
    usage (argparse passes them up to the top level, whose usage lists none of the command's options)."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if isinstance(kwargs.get("help"), str):
            kwargs["help"] = kwargs["help"].replace("%", "%%")
        return super().add_argument(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed, unknown


class _Filling:
    """What a command module's `add_parser(sub)` is handed once its command is chosen, in place of
    the sub-parsers collection: it returns the parser already listed under the command's name."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._parser = parser

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        for key in ("description", "epilog", "formatter_class"):
            if key in kwargs:
                setattr(self._parser, key, kwargs[key])
        return self._parser


class _LazyCommands(argparse._SubParsersAction):  # type: ignore[type-arg]  # argparse's own class
    """Sub-commands listed by name and one line of help; a command's options are added (and its
    module imported) only when argparse reaches that command."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fillers: dict[str, Callable[[Commands], object]] = {}

    def lazy(self, name: str, help: str, fill: Callable[[Commands], object]) -> None:
        self.add_parser(name, help=help)
        self.fillers[name] = fill

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None
    ) -> None:
        fill = self.fillers.pop(values[0], None)
        if fill is not None:
            fill(cast("Commands", _Filling(self.choices[values[0]])))
        super().__call__(parser, namespace, values, option)


# Commands whose options live with their code: name, the line `deviceplugin --help` shows, module
# (which has `add_parser(sub)` and `main(args)`).
_MODULES = (
    (
        "simulate",
        "run the whole flow end to end on this machine and print the outcome",
        "kubesim.simulate",
    ),
    ("extender", "run the kube-scheduler extender", "deviceplugin.extender"),
    ("inspect", "show GPU allocation per node", "deviceplugin.inspect"),
)


EMULATORS = "kubesim"
# As argparse's usage errors: the command cannot run as installed.
EXIT_NO_EMULATORS = 2


def _load(command: str, module: str) -> ModuleType:
    """`module`, or, when it is one of the emulators' and they are not installed (the image, a plain
    install of the product), one line saying how to get them and exit 2."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != EMULATORS:  # a broken install stays a traceback
            raise
        print(
            f"deviceplugin {command}: the emulators (package {EMULATORS}) are not installed; they are not "
            "part of the product: pip install -e ./emulators from a checkout of the repository",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_NO_EMULATORS) from None


def _module_filler(name: str, module: str) -> Callable[[Commands], object]:
    return lambda sub: _load(name, module).add_parser(sub)


def _add_run(sub: Commands) -> None:
    from deviceplugin.config import CONFIG_OPTION, OPTIONS, DaemonConfig

    run = sub.add_parser(
        "run",
        description="Run the node daemon. Every option can also come from its environment variable or "
        "from the config file; a flag wins over the environment, which wins over the file.",
    )
    defaults = {field.name: field.default for field in dataclasses.fields(DaemonConfig)}
    for option in (*OPTIONS, CONFIG_OPTION):
        default = defaults.get(option.field)
        shown = "" if default in (None, dataclasses.MISSING) else f", default {default}"
        names = [f"--{name}" for name in (option.name, *option.aliases)]
        run.add_argument(*names, metavar="VALUE", help=f"{option.help} [env {option.env}{shown}]")


def _add_sim(sub: Commands) -> None:
    sim = sub.add_parser("sim", help="run one emulator (kubelet, apiserver)")
    emulators = sim.add_subparsers(dest="emulator", metavar="EMULATOR", required=True)
    kubelet = emulators.add_parser("kubelet", help="kubelet's device-plugin registration, over real sockets")
    kubelet.add_argument("--dir", type=Path, required=True, help="device-plugin socket directory")
    kubelet.add_argument("--pod-resources-socket", type=Path, help="also serve the pod-resources API here")
    apiserver = emulators.add_parser("apiserver", help="Kubernetes API server (core/v1) over HTTP")
    apiserver.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0 picks a free one)")
    apiserver.add_argument("--kubeconfig-out", type=Path, help="write a kubeconfig pointing at the emulator")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="deviceplugin",
        description="GPU-sharing device plugin for Kubernetes (Volcano-compatible).",
    )
    parser.add_argument("--version", action="version", version=f"deviceplugin {__version__}")
    # The parsers made are _Parsers (argparse makes sub-commands' parsers of their parent's class).
    sub = cast(
        _LazyCommands,
        parser.add_subparsers(action=_LazyCommands, dest="command", metavar="COMMAND", required=True),
    )
    sub.lazy("run", "run the node daemon (kubelet device plugin)", _add_run)
    for name, help, module in _MODULES:
        sub.lazy(name, help, _module_filler(name, module))
    _add_sim(sub)
    return parser


def _upstream_invocation(argv: Sequence[str]) -> list[str]:
    """The upstream DaemonSets hand the daemon's flags straight to the image (`args:
    ["--gpu-strategy=number"]`): flags without a command mean `run`, so swapping the image keeps
    them working."""
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        return ["run", *argv]
    return list(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(_upstream_invocation(sys.argv[1:] if argv is None else argv))
    command: str = args.command
    # Imported here, for the chosen command only (see the module's docstring).
    if command == "run":
        from deviceplugin import runner
        from deviceplugin.config import CONFIG_OPTION, OPTIONS
        from deviceplugin.options import OptionError
        from deviceplugin.plugin.daemon import EXIT_CONFIG

        flags = {
            option.name: getattr(args, option.name.replace("-", "_")) for option in (*OPTIONS, CONFIG_OPTION)
        }
        try:
            return runner.run(flags)
        except OptionError as err:
            print(f"deviceplugin run: {err}", file=sys.stderr)
            return EXIT_CONFIG
    for name, _, module in _MODULES:
        if command == name:
            code: int = _load(name, module).main(args)
            return code
    if args.emulator == "apiserver":
        apiserver: int = _load("sim", f"{EMULATORS}.apiserver").run_apiserver(args.port, args.kubeconfig_out)
        return apiserver
    kubelet: int = _load("sim", f"{EMULATORS}.kubelet").run_kubelet(
        args.dir, pod_resources_socket=args.pod_resources_socket
    )
    return kubelet


if __name__ == "__main__":
    sys.exit(main())
