"""Kubernetes resource quantities (`"1024"`, `"16Gi"`, `"500m"`, `"1e3"`), parsed exactly.

Only what the fit rules need: the exact value, Kubernetes' `Value()` (rounded up to an integer)
and `AsInt64()` (exact integers only). Text longer than the API server writes is refused before it
is parsed (`bounds.MAX_QUANTITY_LENGTH`), and so are exponents whose exact value would be huge.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from deviceplugin.fit import goint
from deviceplugin.fit.bounds import MAX_QUANTITY_EXPONENT, MAX_QUANTITY_LENGTH, shown
from deviceplugin.fit.errors import QuantityError

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<exp>[eE][+-]?\d+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?",
    re.ASCII,  # the grammar's digits are 0-9 only
)
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)
_DECIMAL_EXPONENT = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_EXPONENT = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIX = {  # each suffix's exact multiplier
    **{suffix: Fraction(2) ** power for suffix, power in _BINARY_EXPONENT.items()},
    **{suffix: Fraction(10) ** power for suffix, power in _DECIMAL_EXPONENT.items() if suffix},
}
_GO_INT64_DIGITS = 18  # apimachinery's maxInt64Factors
_MAX_INT = 10**MAX_QUANTITY_LENGTH
# Go's Value() of N x 10^scale, N < 10^64, is the same for every scale past ±128: 1 (rounded up
# from below 1) on one side, the int64 cap on the other; so the scale is clamped to that range.
_VALUE_SCALE = 2 * MAX_QUANTITY_LENGTH


def _check_int(value: int) -> int:
    if not -_MAX_INT < value < _MAX_INT:
        raise QuantityError(  # not str(value): past 4,300 digits that raises
            f"quantity is an integer of {value.bit_length()} bits; a Kubernetes quantity has at most "
            f"{MAX_QUANTITY_LENGTH} digits"
        )
    return value


def _match(text: str) -> re.Match[str]:
    """The grammar's match of a quantity's text, its length checked first."""
    if len(text) > MAX_QUANTITY_LENGTH:
        raise QuantityError(
            f"quantity {shown(text)} has {len(text)} characters; the API server writes at most "
            f"{MAX_QUANTITY_LENGTH}"
        )
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise QuantityError(f"quantity {text!r} is not a Kubernetes quantity (like 1024, 16Gi, 500m)")
    return match


def parse_quantity(value: object) -> Fraction:
    """Exact value of a quantity given as a string or a JSON number."""
    if isinstance(value, bool):
        raise QuantityError(f"quantity {value!r} is a boolean, not a number")
    if isinstance(value, int):
        return Fraction(_check_int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"quantity {value!r} is not finite")
        return Fraction(repr(value))
    if not isinstance(value, str):
        raise QuantityError(f"quantity {value!r} is a {type(value).__name__}, not a string or number")
    match = _match(value)
    amount = Fraction(match["number"])
    if match["exp"]:
        exponent = int(match["exp"][1:])  # at most 62 digits: the text is bounded
        if abs(exponent) > MAX_QUANTITY_EXPONENT:
            raise QuantityError(
                f"quantity {value!r}: exponent {exponent} is beyond ±{MAX_QUANTITY_EXPONENT} (Kubernetes "
                f"saturates values at 2^63-1 and rounds them up to 1e-9)"
            )
        amount *= Fraction(10) ** exponent
    elif match["suffix"]:
        amount *= _SUFFIX[match["suffix"]]
    return -amount if match["sign"] == "-" else amount


def whole_quantity(value: object) -> int | None:
    """The quantity as a count of whole devices or units; None when it is negative or has a
    fraction (QuantityError when it is no quantity)."""
    amount = parse_quantity(value)
    return amount.numerator if amount >= 0 and amount.denominator == 1 else None


def quantity_ceil(value: object) -> int:
    """Kubernetes `Quantity.Value()`: the value rounded away from zero to an integer."""
    amount = parse_quantity(value)
    return math.ceil(amount) if amount >= 0 else -math.ceil(-amount)


def go_quantity_value(value: object) -> int:
    """Go's `Quantity.Value()`: `quantity_ceil`, but ParseQuantity caps the magnitude at the
    largest int64, so "1e30" (and "1e999999999") reads as 2^63-1."""
    negative, digits, fraction, exponent, binary = _go_parts(value)
    scale = max(-_VALUE_SCALE, min(exponent - len(fraction), _VALUE_SCALE))
    amount = int(digits + fraction) * Fraction(10) ** scale * (1 << binary)
    ceiled = min(math.ceil(amount), _INT64_MAX)
    return -ceiled if negative else ceiled


def quantity_as_int64(value: object) -> int | None:
    """Kubernetes `Quantity.AsInt64()`: the value when it is an integer within int64, else None."""
    amount = parse_quantity(value)
    if amount.denominator != 1 or not _INT64_MIN <= amount.numerator <= _INT64_MAX:
        return None
    return amount.numerator


def _go_text(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise QuantityError(f"quantity {value!r} is a {type(value).__name__}, not a string or number")
    if isinstance(value, int):
        _check_int(value)
    return value if isinstance(value, str) else repr(value)  # a JSON number reaches Go as its text


def _go_parts(value: object) -> tuple[bool, str, str, int, int]:
    """What Go's ParseQuantity reads: (negative, integer digits without leading zeros ("0" when
    none), fraction digits, decimal exponent, binary exponent). The `e` exponent is Go's: an
    int64 (longer is a parse error), wrapped to int32."""
    match = _match(_go_text(value))
    whole, _, fraction = match["number"].partition(".")
    exponent = binary = 0
    if match["exp"]:
        parsed, ok = goint.parse_int(match["exp"][1:])
        if not ok:
            raise QuantityError(f"quantity {value!r}: exponent {match['exp'][1:]} is not an int64")
        exponent = goint.int32(parsed)
    elif match["suffix"] in _BINARY_EXPONENT:
        binary = _BINARY_EXPONENT[match["suffix"]]
    else:
        exponent = _DECIMAL_EXPONENT[match["suffix"] or ""]
    return match["sign"] == "-", whole.lstrip("0") or "0", fraction, exponent, binary


def go_quantity_as_int64(value: object) -> int | None:
    """`AsInt64()` of the Quantity Go's `ParseQuantity` builds, for compat="volcano".

    Go keeps a quantity as a scaled int64 only on its fast path (at most 18 significant digits;
    fewer for large binary suffixes) and answers AsInt64 only for a scale >= 0 there: so "2000m",
    "1.0", "1Pi" and 19-digit numbers read as not-an-int64, although their values are integers.
    The API server stores canonical forms ("2000m" -> "2"), where the two readings agree.
    """
    negative, digits, fraction, scale, binary = _go_parts(value)
    mantissa = 1
    if binary:
        scale, mantissa = 0, 1 << binary
        precision = 15 - len(digits) - binary * 3 // 10 - 1  # a fraction: scale < 0 below
    else:
        precision = _GO_INT64_DIGITS - len(digits) - len(fraction)
    scale -= len(fraction)
    if precision < 0 or scale < 0:
        return None  # the arbitrary-precision path, or a negative scale: AsInt64 says no
    significand = int(digits + fraction)
    if significand == 0:
        return 0
    if scale > _GO_INT64_DIGITS:
        return None  # 10^19 alone is past int64: Go's scaling overflows
    amount: int = significand * mantissa * 10**scale
    if amount > _INT64_MAX:
        return None
    return -amount if negative else amount
