"""Command line: `deviceplugin run | simulate | extender | inspect | sim`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from deviceplugin import __version__, extender, inspect, runner
from deviceplugin.config import CONFIG_OPTION, OPTIONS, DaemonConfig, OptionError
from deviceplugin.plugin import daemon
from deviceplugin.sim import simulate
from deviceplugin.sim.apiserver import run_apiserver
from deviceplugin.sim.kubelet import run_kubelet


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


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser(
        "run",
        help="run the node daemon (kubelet device plugin)",
        description="Run the node daemon. Every option can also come from its environment variable or "
        "from the config file; a flag wins over the environment, which wins over the file.",
    )
    defaults = {field.name: field.default for field in dataclasses.fields(DaemonConfig)}
    for option in (*OPTIONS, CONFIG_OPTION):
        default = defaults.get(option.field)
        shown = "" if default in (None, dataclasses.MISSING) else f", default {default}"
        names = [f"--{name}" for name in (option.name, *option.aliases)]
        run.add_argument(*names, metavar="VALUE", help=f"{option.help} [env {option.env}{shown}]")


def _add_sim(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    # Each command's module takes an ArgumentParser's sub-parsers; the parsers made are _Parsers.
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND", required=True),
    )
    _add_run(sub)
    simulate.add_parser(sub)
    extender.add_parser(sub)
    inspect.add_parser(sub)
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
    if command == "run":
        flags = {
            option.name: getattr(args, option.name.replace("-", "_")) for option in (*OPTIONS, CONFIG_OPTION)
        }
        try:
            return runner.run(flags)
        except OptionError as err:
            print(f"deviceplugin run: {err}", file=sys.stderr)
            return daemon.EXIT_CONFIG
    if command == "simulate":
        return simulate.main(args)
    if command == "extender":
        return extender.main(args)
    if command == "inspect":
        return inspect.main(args)
    if args.emulator == "apiserver":
        return run_apiserver(args.port, args.kubeconfig_out)
    return run_kubelet(args.dir, pod_resources_socket=args.pod_resources_socket)


if __name__ == "__main__":
    sys.exit(main())
