"""Run every benchmark and print one table of their rows: metric, value, floor, ratio, target, result.

Run: `make bench` (or `.venv/bin/python bench/run_all.py [name ...]` for some of them).
Exits 1 when a benchmark fails to run or a row misses its target.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from report import ROWS_ENV, load, table

HERE = Path(__file__).resolve().parent
# Each benchmark by name: its script and arguments.
BENCHMARKS: dict[str, tuple[str, ...]] = {
    "fit": ("fit.py",),
    "listandwatch": ("listandwatch.py",),
    "daemon": ("daemon.py",),
    "kube": ("kube.py",),
    "memory": ("memory.py",),
    "startup": ("startup.py",),
    "allocate": ("allocate.py",),
    "allocate-vgpu": ("allocate.py", "--strategy", "vgpu"),
    "allocate-mig": ("allocate_mig.py",),
    "outbox": ("outbox.py",),
    "extender": ("extender.py",),
    # multi-GPU pods on nodes publishing NVLink islands, gpu-aware on (issue 17)
    "extender-topology": (
        "extender.py",
        "--strategies",
        "number,vgpu",
        "--multi-gpu",
        "--topology",
        "--gpu-aware",
    ),
    "http_servers": ("http_servers.py",),
    "fragmentation": ("fragmentation.py",),
}


def main() -> int:
    names = sys.argv[1:] or list(BENCHMARKS)
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    broken = []
    with tempfile.TemporaryDirectory(prefix="dpbench") as work:
        rows_file = os.path.join(work, "rows.jsonl")
        open(rows_file, "w").close()
        for name in names:
            script, *args = BENCHMARKS[name]
            print(f"\n=== bench/{' '.join((script, *args))}", flush=True)
            env = {**os.environ, ROWS_ENV: rows_file}
            run = subprocess.run([sys.executable, str(HERE / script), *args], check=False, env=env)
            if run.returncode != 0:
                broken.append(f"{name} (exit {run.returncode})")
        rows = load(rows_file)
    print("\n=== every benchmark\n" + table(rows))
    if broken:
        print(f"benchmarks that did not finish: {', '.join(broken)}")
    return 1 if broken or not all(row.passed for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
