"""A kubeconfig that is not one: every command that loads one (`run`, `extender`, `inspect`) stops with
one line naming the file and what is wrong, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

MALFORMED = {
    "a list": "- clusters\n- users\n",
    "a plain string": "just text\n",
    "invalid YAML": "clusters: [\n",
    "clusters not a list": "apiVersion: v1\nkind: Config\nclusters: 5\n",
    "a context not a mapping": "apiVersion: v1\nkind: Config\ncurrent-context: a\ncontexts: [5]\n",
    "a cluster entry without its cluster": (
        "apiVersion: v1\nkind: Config\ncurrent-context: a\nclusters: [{name: c}]\n"
        "contexts: [{name: a, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    ),
}


def command(name: str, kubeconfig: Path, workdir: Path) -> list[str]:
    given = ["--kubeconfig", str(kubeconfig)]
    if name == "run":
        return [
            *("run", "--node-name", "n1", "--fake-gpus", "1x100", "--metrics-address", "127.0.0.1:0"),
            *("--device-plugin-dir", str(workdir / "plugins"), "--state-dir", str(workdir / "state")),
            *given,
        ]
    if name == "extender":
        return ["extender", "--address", "127.0.0.1:0", *given]
    return ["inspect", *given]


@pytest.mark.parametrize("name", ["run", "extender", "inspect"])
@pytest.mark.parametrize("what", list(MALFORMED))
def test_a_malformed_kubeconfig_is_one_clear_line(name: str, what: str, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(MALFORMED[what])
    done = subprocess.run(
        [sys.executable, "-m", "deviceplugin.cli", *command(name, kubeconfig, tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if f"kubeconfig {kubeconfig}" in line]
    assert len(lines) == 1, done.stderr
    assert "cannot use the kubeconfig" in lines[0]
