"""The real `kubectl` for the emulator tests: where to find it, how to run it, how to read its tables."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.sim.apiserver_helpers import Obj
from tests.tools import find_tool, missing

RUN_TIMEOUT_S = 30
MISSING = missing("kubectl")


def find_kubectl() -> str | None:
    return find_tool("kubectl")


@dataclass
class Kubectl:
    binary: str
    env: dict[str, str]
    workdir: Path

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [self.binary, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [self.binary, *args], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def manifest(self, name: str, obj: Obj) -> str:
        """`obj` written to `name` under the workdir, as JSON or (any other suffix) YAML."""
        path = self.workdir / name
        path.write_text(json.dumps(obj) if name.endswith(".json") else yaml.safe_dump(obj))
        return str(path)


def kubectl_for(binary: str, kubeconfig: Path, workdir: Path) -> Kubectl:
    """kubectl with a home of its own under `workdir` (its discovery cache lives there)."""
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "KUBECACHEDIR": str(workdir / "kube-cache"),
        "KUBECONFIG": str(kubeconfig),
        "TZ": "UTC",  # times kubectl prints
    }
    return Kubectl(binary, env, workdir)


def table(output: str) -> list[list[str]]:
    """kubectl's columns, split on runs of two or more spaces."""
    return [[cell for cell in line.split("  ") if cell.strip()] for line in output.strip().splitlines()]


def cells(output: str) -> list[list[str]]:
    return [[cell.strip() for cell in row] for row in table(output)]
