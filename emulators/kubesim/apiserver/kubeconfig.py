"""A kubeconfig that points the `kubernetes` client and kubectl at the emulator (plain HTTP, no auth)."""

from __future__ import annotations

from pathlib import Path

import yaml

CONTEXT = "deviceplugin-sim"


def write_kubeconfig(path: Path, server_url: str, namespace: str = "default") -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server_url}}],
        "users": [{"name": CONTEXT, "user": {}}],
        "contexts": [
            {"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace}}
        ],
        "current-context": CONTEXT,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
