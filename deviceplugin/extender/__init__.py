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
    DEFAULT_ADDRESS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_REQUEST_TIMEOUT_S,
    ExtenderConfig,
    ExtenderConfigError,
    load_config,
)
from deviceplugin.kube.api import ConfigError as KubeConfigError

__all__ = ["Extender", "ExtenderConfig", "ExtenderConfigError", "add_parser", "load_config", "main"]

EXIT_CONFIG = 2

_HELP = {
    "address": f"listen address HOST:PORT or :PORT [default {DEFAULT_ADDRESS}]",
    "strategy": "GPU family to schedule: share (volcano.sh/gpu-memory), number (volcano.sh/gpu-number), "
    "vgpu (volcano.sh/vgpu-*) [default share]",
    "policy": "node and card order: binpack or spread [default binpack]",
    "weight": "multiplier of the node score (capped at 10); <= 0 turns scoring off [default 1]",
    "compat": "'volcano' reproduces Volcano's decisions exactly, bugs included [default none]",
    "kubeconfig": "kubeconfig file [env KUBECONFIG; default: in-cluster service account]",
    "log-format": "text or json [default text]",
    "log-level": "debug, info, warning or error [default info]",
    "max-body-bytes": "largest request body, bytes or a quantity (8Mi); larger gets 413 unread "
    f"[default {DEFAULT_MAX_BODY_BYTES}: NodeNames of 20,000 nodes and a large pod, with margin]",
    "max-connections": "open connections; at the cap a new one closes the one idle longest "
    f"[default {DEFAULT_MAX_CONNECTIONS}]",
    "request-timeout": "seconds a request may take to arrive whole; slower gets 408 "
    f"[default {DEFAULT_REQUEST_TIMEOUT_S:g}]",
}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the `extender` sub-command with its options; returns its parser."""
    parser = sub.add_parser(
        "extender",
        help="run the kube-scheduler extender",
        description="Run the kube-scheduler extender (filter, prioritize, bind) for Volcano's GPU-sharing "
        "resources. Options come from flags or from the YAML config file (keys are the flag names, or "
        "Volcano's deviceshare.* arguments); a flag wins over the file.",
    )
    for option, text in _HELP.items():
        parser.add_argument(f"--{option}", metavar="VALUE", help=text)
    parser.add_argument(f"--{CONFIG_OPTION}", metavar="FILE", help="YAML config file")
    return parser


def main(args: argparse.Namespace) -> int:
    """Run the extender with the options `add_parser` defined; returns the exit status."""
    flags = {option: getattr(args, option.replace("-", "_"), None) for option in (*_HELP, CONFIG_OPTION)}
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
