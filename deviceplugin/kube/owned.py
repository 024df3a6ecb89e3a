"""Copies of API objects' JSON values that share no object with what was served.

A cache that keeps a projection of each object must not keep any piece of the object itself: one
string left alive pins the allocator arena it was parsed into, with the rest of that list.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

SHORT = 16  # values this short repeat across objects (GPU indices, quantities, "true"): interned


def owned(value: Any, *, intern: bool = True) -> Any:
    """A copy of a JSON value that shares no object with it; keys and, unless `intern` is false,
    short strings are interned."""
    if type(value) is str:
        copy = value.encode().decode()
        return sys.intern(copy) if intern and len(copy) <= SHORT else copy
    if isinstance(value, Mapping):
        return {sys.intern(owned(key)): owned(item) for key, item in value.items()}
    if isinstance(value, list):
        return [owned(item) for item in value]
    return value  # None, a bool, a number
