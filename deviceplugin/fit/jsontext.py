"""JSON text from outside the process (annotations, files, request bodies, event lines) decoded as
a value or a ValueError, whatever the text holds.

Python's decoder recurses once per level of nesting, so `[[[[...]]]]` raises RecursionError, not
the ValueError every reader of malformed JSON expects: a crash, or a 500, rather than an error
naming the input. `loads` makes it a ValueError (`TooDeep`) like any other malformed text.
"""

from __future__ import annotations

import json
from typing import Any


class TooDeep(ValueError):
    """The text nests deeper than the decoder can follow."""


def loads(text: str | bytes, **options: Any) -> Any:
    """`json.loads(text, **options)`; ValueError for any text that is not a JSON value, a
    `TooDeep` one ("nested too deeply to read") for nesting past the decoder's recursion."""
    try:
        return json.loads(text, **options)
    except RecursionError:
        raise TooDeep("nested too deeply to read") from None
