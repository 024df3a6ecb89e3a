"""One row format for every benchmark, and the one table `make bench` prints.

Each benchmark measures its floor in the same run and reports rows through `record`: it prints them
and, when `bench/run_all.py` runs it, appends them as JSON lines to the file in $BENCH_ROWS so
that one table of every row comes out at the end.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

ROWS_ENV = "BENCH_ROWS"


@dataclass(frozen=True)
class Row:
    metric: str  # what was measured, with its size: "Allocate p50, 10,000 allocations"
    value: float
    unit: str  # "ms", "MB", "KB/pod", ...
    floor: float | None  # the same-run floor in the same unit; None where the target is absolute
    target: str  # what it must meet, as the issue names it: "ratio <= 3", "<= 150 ms"
    passed: bool

    @property
    def ratio(self) -> float | None:
        return None if not self.floor else self.value / self.floor


def _cell(number: float | None) -> str:
    if number is None:
        return "-"
    return f"{number:,.3g}" if abs(number) < 100 else f"{number:,.0f}"


def table(rows: Sequence[Row]) -> str:
    header = ("metric", "value", "floor", "ratio", "target", "result")
    body = [
        (
            row.metric,
            f"{_cell(row.value)} {row.unit}",
            "-" if row.floor is None else f"{_cell(row.floor)} {row.unit}",
            "-" if row.ratio is None else f"{row.ratio:.2f}x",
            row.target,
            "pass" if row.passed else "FAIL",
        )
        for row in rows
    ]
    grid = [header, *body]
    widths = [max(len(line[i]) for line in grid) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in grid]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def record(rows: Iterable[Row]) -> None:
    """Print the rows; also append them to $BENCH_ROWS when a run of every benchmark collects them."""
    rows = list(rows)
    print(table(rows))
    path = os.environ.get(ROWS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(asdict(row)) + "\n")


def load(path: str) -> list[Row]:
    with open(path, encoding="utf-8") as rows:
        return [Row(**json.loads(line)) for line in rows if line.strip()]
