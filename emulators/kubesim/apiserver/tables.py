"""`meta.k8s.io/v1 Table` responses: what a client gets when it asks `Accept: ...;as=Table`."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Literal

from kubesim.apiserver.kinds import Kind
from kubesim.apiserver.meta import Obj

#: TableOptions.includeObject: what each row carries besides its cells (the server's default: Metadata).
IncludeObject = Literal["None", "Metadata", "Object"]


def table(kind: Kind, objects: Iterable[Obj], *, metadata: Obj, include: IncludeObject, version: str) -> Obj:
    printer = kind.printer
    now = time.time()
    rows: list[Obj] = []
    for obj in objects:
        row: Obj = {"cells": printer.cells(obj, now)}
        conditions = printer.conditions(obj)
        if conditions:
            row["conditions"] = conditions
        if include == "Object":
            row["object"] = obj
        elif include == "Metadata":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": f"meta.k8s.io/{version}",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": metadata,
        "columnDefinitions": [column.definition() for column in printer.columns],
        "rows": rows,
    }
