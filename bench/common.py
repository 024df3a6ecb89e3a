"""Helpers every benchmark shares: the daemon's command line and latency percentiles."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from pathlib import Path


def daemon_command(work: Path, node: str, fake_gpus: str, extra: Sequence[str] = ()) -> list[str]:
    """`deviceplugin run` on fake GPUs with its kubelet directory and state under `work`.

    The metrics server takes a free port; `extra` adds or overrides flags (argparse keeps the last).
    """
    return [
        sys.executable,
        "-m",
        "deviceplugin.cli",
        "run",
        "--metrics-address",
        "127.0.0.1:0",
        "--node-name",
        node,
        "--device-plugin-dir",
        str(work / "dp"),
        "--state-dir",
        str(work / "state"),
        "--fake-gpus",
        fake_gpus,
        *extra,
    ]


def percentiles(samples: Sequence[float]) -> tuple[float, float, float]:
    """p50, p99 and the worst of the samples."""
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[max(0, int(len(ordered) * 0.99) - 1)], ordered[-1]


def api_access_volume(name: str = "kube-api-access") -> dict[str, object]:
    """The projected service-account volume the API server adds to every pod (benchmarks' pods
    carry what real ones do, so that caches and parsers see their real size)."""
    return {
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            ],
        },
    }
