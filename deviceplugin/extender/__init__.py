"""kube-scheduler extender (v1, HTTP + JSON) built on the shared-fit library: `deviceplugin extender`.

Entry points: `add_parser(sub)` adds the `extender` sub-command and its options to an argparse
sub-parser collection, `main(args)` runs it until SIGTERM/SIGINT; `Extender(config, kube)` runs it
in-process (`.start()`, `.url`, `.stop()`). docs/extender.md describes endpoints and configuration.
"""

from __future__ import annotations

import argparse
import logging
import sys

from deviceplugin import logs
from deviceplugin.extender.app import Extender, run
from deviceplugin.extender.config import (
    CONFIG_OPTION,
    OPTIONS,
    ExtenderConfig,
    ExtenderConfigError,
    load_config,
)
from deviceplugin.kube.api import ConfigError as KubeConfigError

__all__ = ["Extender", "ExtenderConfig", "ExtenderConfigError", "add_parser", "load_config", "main"]

EXIT_CONFIG = 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the `extender` sub-command with its options; returns its parser."""
    parser = sub.add_parser(
        "extender",
        help="run the kube-scheduler extender",
        description="Run the kube-scheduler extender (filter, prioritize, bind) for Volcano's GPU-sharing "
        "resources. Options come from flags or from the YAML config file (keys are the flag names, or "
        "Volcano's deviceshare.* arguments); a flag wins over the file.",
    )
    for option in OPTIONS:
        parser.add_argument(f"--{option.name}", metavar="VALUE", help=option.help)
    parser.add_argument(f"--{CONFIG_OPTION.name}", metavar="FILE", help=CONFIG_OPTION.help)
    return parser


def main(args: argparse.Namespace) -> int:
    """Run the extender with the options `add_parser` defined; returns the exit status."""
    flags = {option.name: getattr(args, option.field, None) for option in (*OPTIONS, CONFIG_OPTION)}
    try:
        config = load_config(flags)
    except ExtenderConfigError as err:
        print(f"deviceplugin extender: {err}", file=sys.stderr)
        return EXIT_CONFIG
    logs.configure(config.log_format, getattr(logging, config.log_level.upper()))
    try:
        return run(config)
    except KubeConfigError as err:
        print(f"deviceplugin extender: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as err:
        print(f"deviceplugin extender: cannot listen on {config.address}: {err}", file=sys.stderr)
        return 1
