"""The `deviceplugin` command as a user runs it (a real subprocess)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deviceplugin.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_help_lists_every_subcommand() -> None:
    done = run("--help")
    assert done.returncode == 0
    for command in ("run", "simulate", "extender", "inspect", "sim"):
        assert command in done.stdout


def test_simulate_plays_the_documented_scenarios_end_to_end() -> None:
    done = run("simulate")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.rstrip().splitlines()[-1].startswith("every step behaved as documented")
    assert "BAD" not in out
    workers = [f"demo/job-worker-{n}" for n in range(3)]
    for pod in ("demo/share-a", "demo/share-b", "demo/whole-pair", *workers):
        assert re.search(rf"^{pod} .* Running ", out, flags=re.M), out
    assert out.count("VOLCANO_GPU_ALLOCATED=1024") == 2
    assert out.count("CUDA_DEVICE_MEMORY_LIMIT_0=1024m") == 3
    assert 'volcano_vgpu_device_allocated_memory{NodeName="gpu-vgpu-1"' in out
    assert "state/ledger.db" in out


SCENARIO = """
apiVersion: v1
kind: Pod
metadata: {name: small, namespace: team-a}
spec:
  containers:
  - name: main
    image: cuda
    resources: {limits: {volcano.sh/gpu-memory: "2048"}}
---
apiVersion: v1
kind: Pod
metadata: {name: huge}
spec:
  containers:
  - name: main
    image: cuda
    resources: {limits: {volcano.sh/gpu-memory: "99999"}}
"""


def test_simulate_runs_a_users_scenario(tmp_path: Path) -> None:
    scenario = tmp_path / "pods.yaml"
    scenario.write_text(SCENARIO)
    done = run("simulate", "--scenario", str(scenario))
    out = done.stdout
    assert done.returncode == 1, out + done.stderr  # "huge" fits no GPU
    small = r"^team-a/small +gpu-share-1 +[01] +Running .*VOLCANO_GPU_ALLOCATED=2048"
    assert re.search(small, out, re.M), out
    assert re.search(r"^default/huge +- +- +FAILED", out, re.M), out
    assert "BAD: default/huge: unschedulable" in out


def test_simulate_refuses_a_scenario_that_is_not_pods(tmp_path: Path) -> None:
    scenario = tmp_path / "node.yaml"
    scenario.write_text("apiVersion: v1\nkind: Node\nmetadata: {name: n}\n")
    done = run("simulate", "--scenario", str(scenario))
    assert done.returncode == 2
    assert "every document must be a named Pod" in done.stdout


def test_flags_without_a_command_run_the_daemon_as_the_upstream_daemonsets_pass_them() -> None:
    done = run("--gpu-strategy=bogus")
    assert done.returncode == 2
    assert done.stderr.startswith("deviceplugin run:") and "gpu-strategy" in done.stderr


def test_unknown_command_is_rejected() -> None:
    done = run("frobnicate")
    assert done.returncode == 2
    assert "invalid choice" in done.stderr
