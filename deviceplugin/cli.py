"""Command line: `deviceplugin run | simulate | extender | inspect | sim`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from deviceplugin import __version__
from deviceplugin.sim.walkthrough import main as simulate


def _not_yet(name: str) -> int:
    print(f"deviceplugin {name}: not available in this build yet", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deviceplugin",
        description="GPU-sharing device plugin for Kubernetes (Volcano-compatible).",
    )
    parser.add_argument("--version", action="version", version=f"deviceplugin {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sub.add_parser("run", help="run the node daemon (kubelet device plugin)")
    sub.add_parser("simulate", help="play the documented scenarios end to end and print the outcome")
    sub.add_parser("extender", help="run the kube-scheduler extender")
    sub.add_parser("inspect", help="show GPU allocation per node")
    sub.add_parser("sim", help="run one emulator (API server, kubelet)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command: str = args.command
    if command == "simulate":
        return simulate()
    return _not_yet(command)


if __name__ == "__main__":
    sys.exit(main())
