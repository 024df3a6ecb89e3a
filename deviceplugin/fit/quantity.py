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
_DECIMAL_EXPONENT = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_EXPONENT = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_GO_INT64_DIGITS = 18  # apimachinery's maxInt64Factors


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


def go_quantity_value(value: object) -> int:
    """Go's `Quantity.Value()`: `quantity_ceil`, but ParseQuantity caps the magnitude at the
    largest int64, so "1e30" reads as 2^63-1."""
    ceiled = quantity_ceil(value)
    return max(-_INT64_MAX, min(ceiled, _INT64_MAX))


def quantity_as_int64(value: object) -> int | None:
    """Kubernetes `Quantity.AsInt64()`: the value when it is an integer within int64, else None."""
    amount = parse_quantity(value)
    if amount.denominator != 1 or not _INT64_MIN <= amount.numerator <= _INT64_MAX:
        return None
    return amount.numerator


def _go_text(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityError(f"quantity {value!r} is a {type(value).__name__}, not a string or number")
    return value if isinstance(value, str) else repr(value)  # a JSON number reaches Go as its text


def go_quantity_as_int64(value: object) -> int | None:
    """`AsInt64()` of the Quantity Go's `ParseQuantity` builds, for compat="volcano".

    Go keeps a quantity as a scaled int64 only on its fast path (at most 18 significant digits;
    fewer for large binary suffixes) and answers AsInt64 only for a scale >= 0 there: so "2000m",
    "1.0", "1Pi" and 19-digit numbers read as not-an-int64, although their values are integers.
    The API server stores canonical forms ("2000m" -> "2"), where the two readings agree.
    """
    parse_quantity(value)  # the same grammar, so the same errors
    match = _QUANTITY.fullmatch(_go_text(value))
    assert match is not None
    whole, _, fraction = match["number"].partition(".")
    digits = whole.lstrip("0") or "0"
    mantissa = 1
    if match["exp"]:
        scale = int(match["exp"][1:])
        precision = _GO_INT64_DIGITS - len(digits) - len(fraction)
    elif match["suffix"] in _BINARY_EXPONENT:
        exponent = _BINARY_EXPONENT[match["suffix"]]
        scale, mantissa = 0, 1 << exponent
        precision = 15 - len(digits) - exponent * 3 // 10 - 1  # a fraction: scale < 0 below
    else:
        scale = _DECIMAL_EXPONENT[match["suffix"] or ""]
        precision = _GO_INT64_DIGITS - len(digits) - len(fraction)
    scale -= len(fraction)
    if precision < 0 or scale < 0:
        return None  # the arbitrary-precision path, or a negative scale: AsInt64 says no
    amount: int = int(digits + fraction) * mantissa * 10**scale
    if amount > _INT64_MAX:
        return None
    return -amount if match["sign"] == "-" else amount
