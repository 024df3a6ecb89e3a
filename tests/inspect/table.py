"""Read the text report back into cells, by the columns of its header line."""

from __future__ import annotations

import re


def read_table(text: str) -> list[dict[str, str]]:
    """Rows of the first table in `text` (up to the first blank line); a continuation row inherits
    the node columns (NAME, IPADDRESS, STRATEGY) of the row above."""
    lines = text.splitlines()
    header = lines[0]
    starts = [match.start() for match in re.finditer(r"\S+", header)]
    names = header.split()
    rows: list[dict[str, str]] = []
    for line in lines[1:]:
        if not line.strip():
            break
        bounds = [*starts[1:], None]
        row = {name: line[start:end].strip() for name, start, end in zip(names, starts, bounds, strict=True)}
        if "NAME" in row and not row["NAME"] and rows:
            for key in ("NAME", "IPADDRESS", "STRATEGY"):
                if key in row:
                    row[key] = rows[-1][key]
        rows.append(row)
    return rows


def gpu_row(text: str, node: str, gpu: str) -> dict[str, str]:
    matches = [row for row in read_table(text) if row["NAME"] == node and row["GPU"] == gpu]
    assert len(matches) == 1, f"no single row for {node} GPU {gpu} in:\n{text}"
    return matches[0]
