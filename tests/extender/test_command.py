"""`deviceplugin extender` as a process: serves from its kubeconfig and stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from kubesim.apiserver import ApiServerEmulator
from tests.extender.conftest import ExtenderClient, create_pod, memory_pod, share_node

# The sub-command exactly as the CLI wires it: add_parser on the sub-parsers, then main(args).
LAUNCHER = """
import argparse, sys
from deviceplugin.extender import add_parser, main
parser = argparse.ArgumentParser(prog="deviceplugin")
add_parser(parser.add_subparsers(dest="command"))
sys.exit(main(parser.parse_args(sys.argv[1:])))
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serves_until_sigterm(apiserver: ApiServerEmulator, tmp_path: Path) -> None:
    apiserver.create("nodes", share_node("n1"))
    pod = create_pod(apiserver, memory_pod("new", 1000))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    config = tmp_path / "extender.yaml"
    config.write_text("deviceshare.GPUSharingEnable: true\ndeviceshare.SchedulePolicy: spread\n")
    port = _free_port()
    process = subprocess.Popen(
        [
            *(sys.executable, "-c", LAUNCHER, "extender", "--address", f"127.0.0.1:{port}"),
            *("--kubeconfig", str(kubeconfig), "--config", str(config)),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        client = ExtenderClient(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        answer = "no answer"
        while True:
            assert process.poll() is None, f"the extender exited: {process.communicate()[1]}"
            try:
                response = client.request("GET", "/readyz")
                if response.status == 200:
                    break
                answer = f"{response.status} {response.body!r}"
            except OSError as err:
                answer = str(err)
            assert time.monotonic() < deadline, f"the extender did not become ready: {answer}"
            time.sleep(0.1)
        assert client.filter(pod, ["n1"])["NodeNames"] == ["n1"]
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=15)
    assert process.returncode == 0, stderr
    assert "extender started" in stderr and "strategy=share" in stderr and "policy=spread" in stderr
