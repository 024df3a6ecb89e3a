"""`deviceplugin inspect [NODE]` and the `kubectl-gpushare` plugin: arguments, exit codes, output."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deviceplugin.inspect.jsondoc import render_json
from deviceplugin.inspect.report import build_report
from deviceplugin.inspect.source import InspectError, connect, fetch, resolve_kubeconfig
from deviceplugin.inspect.text import render_text

EXIT_OK = 0
DESCRIPTION = (
    "Show GPU allocation per node and per GPU: allocated/total memory (MiB), vGPU cores and pods "
    "sharing each GPU, pods the scheduler placed but the device plugin has not served yet (pending), "
    "and cluster totals. Exit status: 0 ok, 1 API server unreachable or refused (or NODE not found), "
    "2 bad arguments or kubeconfig."
)


def add_arguments(parser: argparse.ArgumentParser, prog: str) -> None:
    parser.add_argument("node", nargs="?", metavar="NODE", help="show only this node")
    parser.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="output format (default text)"
    )
    parser.add_argument("-d", "--details", action="store_true", help="list the pods on each GPU")
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="PATH",
        help="kubeconfig file (default $KUBECONFIG, then ~/.kube/config, then in-cluster)",
    )
    parser.set_defaults(inspect_prog=prog)


def add_parser(sub: argparse._SubParsersAction[Any]) -> argparse.ArgumentParser:
    """Add the `inspect` sub-command to a subparsers collection; dispatch its Namespace to `main`."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "inspect", help="show GPU allocation per node", description=DESCRIPTION
    )
    add_arguments(parser, "deviceplugin inspect")
    return parser


def main(args: argparse.Namespace) -> int:
    prog = getattr(args, "inspect_prog", "deviceplugin inspect")
    try:
        kube, server = connect(resolve_kubeconfig(args.kubeconfig))
        snapshot = fetch(kube, server, args.node)
    except InspectError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return err.exit_code
    report = build_report(snapshot, keep_non_gpu=args.node is not None)
    text = render_json(report) if args.output == "json" else render_text(report, details=args.details)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kubectl-gpushare` script: `kubectl gpushare [NODE] [-o json] [-d]`."""
    parser = argparse.ArgumentParser(prog="kubectl gpushare", description=DESCRIPTION)
    add_arguments(parser, "kubectl gpushare")
    return main(parser.parse_args(argv))
