"""`deviceplugin simulate` run as a user runs it (a subprocess), its JSON document read back."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TIMEOUT_S = 180


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def document(self) -> dict[str, Any]:
        """stdout must be exactly one JSON document."""
        parsed: dict[str, Any] = json.loads(self.stdout)
        return parsed

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        found: list[dict[str, Any]] = [
            p for p in self.document["pods"] if (p["namespace"], p["name"]) == (namespace, name)
        ]
        assert len(found) == 1, f"{namespace}/{name} not in {[p['name'] for p in self.document['pods']]}"
        return found[0]

    def node(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = next(n for n in self.document["nodes"] if n["name"] == name)
        return found

    def uuid(self, node: str, index: int) -> str:
        return str(self.node(node)["gpus"][index]["uuid"])


def simulate(*args: str) -> Run:
    done = subprocess.run(
        [sys.executable, "-m", "deviceplugin.cli", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def simulate_json(scenario: str | Path | None, tmp_path: Path, *args: str) -> Run:
    """simulate --output json on `scenario` (YAML text, a file, or None for the demo)."""
    if isinstance(scenario, str):
        path = tmp_path / "scenario.yaml"
        path.write_text(scenario)
        scenario = path
    given = ("--scenario", str(scenario)) if scenario is not None else ()
    return simulate(*given, "--output", "json", *args)


def env(pod: dict[str, Any], container: str) -> dict[str, str]:
    found = [c for c in pod["containers"] if c["name"] == container]
    assert len(found) == 1, pod["containers"]
    return dict(found[0]["env"])
