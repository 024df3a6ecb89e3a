"""`deviceplugin` for benchmarks, with two settings the product does not offer.

`python bench/daemon_main.py run ...` is `python -m deviceplugin.cli run ...`, plus:
- BENCH_LEDGER_SYNC=FULL|NORMAL: the ledger's SQLite `synchronous` level, to measure the one the
  product does not use (docs/ledger.md).
- BENCH_PROFILE=PATH: profile every thread with yappi and write pstats to PATH at exit (`python -m
  pstats PATH`); BENCH_PROFILE_CLOCK=wall (default: time blocked in fsync counts) or cpu. Needs
  yappi in the environment (`pip install yappi`; not a project dependency).
"""

from __future__ import annotations

import importlib
import os
import sys

from deviceplugin import cli, ledger


def main() -> int:
    sync = os.environ.get("BENCH_LEDGER_SYNC")
    if sync:
        ledger.SYNCHRONOUS = sync
    profile = os.environ.get("BENCH_PROFILE")
    if not profile:
        return cli.main(sys.argv[1:])
    yappi = importlib.import_module("yappi")  # only here: not a project dependency

    yappi.set_clock_type(os.environ.get("BENCH_PROFILE_CLOCK", "wall"))
    yappi.start()
    try:
        return cli.main(sys.argv[1:])
    finally:
        yappi.stop()
        yappi.get_func_stats().save(profile, type="pstat")


if __name__ == "__main__":
    sys.exit(main())
