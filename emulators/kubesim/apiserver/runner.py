"""`deviceplugin sim apiserver`: the emulator in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

from pathlib import Path

from kubesim.apiserver.server import ApiServerEmulator
from kubesim.signals import stop_signals


def run_apiserver(port: int, kubeconfig_out: Path | None) -> int:
    """Print the URL (and the kubeconfig written, if asked) on stdout, serve until told to stop."""
    with stop_signals() as wait_for_signal, ApiServerEmulator(port=port) as emulator:
        print(emulator.url, flush=True)
        if kubeconfig_out is not None:
            print(emulator.write_kubeconfig(kubeconfig_out), flush=True)
        wait_for_signal()
    return 0
