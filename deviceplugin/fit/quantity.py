"""Kubernetes resource quantities (`"1024"`, `"16Gi"`, `"500m"`, `"1e3"`), parsed exactly.

Only what the fit rules need: the exact value, Kubernetes' `Value()` (rounded up to an integer)
and `AsInt64()` (exact integers only).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from deviceplugin.fit.errors import QuantityError

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?",
    re.ASCII,  # the grammar's digits are 0-9 only
)
_SUFFIX = {
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)


def parse_quantity(value: object) -> Fraction:
    """Exact value of a quantity given as a string or a JSON number."""
    if isinstance(value, bool):
        raise QuantityError(f"quantity {value!r} is a boolean, not a number")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"quantity {value!r} is not finite")
        return Fraction(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"quantity {value!r} is a {type(value).__name__}, not a string or number")
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise QuantityError(f"quantity {value!r} is not a Kubernetes quantity (like 1024, 16Gi, 500m)")
    amount = Fraction(match["number"])
    if match["exp"]:
        amount *= Fraction(10) ** int(match["exp"][1:])
    elif match["suffix"]:
        amount *= _SUFFIX[match["suffix"]]
    return -amount if match["sign"] == "-" else amount


def quantity_ceil(value: object) -> int:
    """Kubernetes `Quantity.Value()`: the value rounded away from zero to an integer."""
    amount = parse_quantity(value)
    return math.ceil(amount) if amount >= 0 else -math.ceil(-amount)


def quantity_as_int64(value: object) -> int | None:
    """Kubernetes `Quantity.AsInt64()`: the value when it is an integer within int64, else None."""
    amount = parse_quantity(value)
    if amount.denominator != 1 or not _INT64_MIN <= amount.numerator <= _INT64_MAX:
        return None
    return amount.numerator
