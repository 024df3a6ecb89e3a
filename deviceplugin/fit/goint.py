"""Go's fixed-width integer and float conversions, for compat="volcano".

Volcano keeps GPU counters in `uint` and requests in `int32`; where a value wraps, Go's
arithmetic, not the mathematical one, decides a fit or a score. These helpers give the exact
results of Go's conversions on amd64 (the platform Volcano ships for), and of `strconv`'s
integer parsers, which read text of any length: here the digits are counted before anything is
converted, so a 100,000-digit annotation costs a length check, not a bignum (nor Python's
4,300-digit `int()` limit).
"""

from __future__ import annotations

import math

_U64 = 2**64
_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1
_I64_INDEFINITE = 2**63  # what amd64's float->int64 conversion gives out of range or for NaN


_ASCII_DIGITS = "0123456789"  # Go's strconv reads these, not other scripts' digits


def _bounded(digits: str, limit: int) -> int | None:
    """`int(digits)` when it is at most `limit`, else None; converts at most `limit`'s digit count."""
    significant = digits.lstrip("0")
    if len(significant) > len(str(limit)):
        return None
    value = int(significant or "0")
    return value if value <= limit else None


def is_decimal(text: str) -> bool:
    """Non-empty ASCII digits (`str.isdigit` alone also takes other scripts' digits and '²')."""
    return text.isascii() and text.isdigit()


def parse_uint(text: str, bits: int = 64) -> tuple[int, bool]:
    """`strconv.ParseUint(text, 10, bits)`: (value, ok). Go reads the digits left to right and
    stops at the first problem: a non-digit (or no digit) is a syntax error, (0, False); a value
    past `bits` bits a range error, (the largest value, False), even if a non-digit follows."""
    limit = 2**bits - 1
    digits = text[: len(text) - len(text.lstrip(_ASCII_DIGITS))]  # the leading run of digits
    value = _bounded(digits, limit)
    if value is None:
        return limit, False
    if not text or len(digits) != len(text):
        return 0, False
    return value, True


def parse_int(text: str, bits: int = 64) -> tuple[int, bool]:
    """`strconv.ParseInt(text, 10, bits)` (`Atoi` is bits=64 on amd64): (value, ok). An optional
    sign, then `parse_uint`'s reading: a syntax error gives (0, False), a number out of range
    (a range error of the digits included) its clamped value and False."""
    negative = text.startswith("-")
    magnitude, ok = parse_uint(text[1:] if text.startswith(("+", "-")) else text, bits)
    if not ok and magnitude == 0:
        return 0, False  # a syntax error
    cutoff = 2 ** (bits - 1)
    if not negative and magnitude >= cutoff:
        return cutoff - 1, False
    if negative and magnitude > cutoff:
        return -cutoff, False
    return (-magnitude if negative else magnitude), True


def uint64(value: int) -> int:
    """`uint64(x)` of an integer: wrap modulo 2^64."""
    return value % _U64


def int64(value: int) -> int:
    """`int64(x)` of an integer (or `int(u)` of a uint): wrap to the signed 64-bit range."""
    return (value + 2**63) % _U64 - 2**63


def int32(value: int) -> int:
    """`int32(x)`: wrap to the signed 32-bit range."""
    return (value + 2**31) % 2**32 - 2**31


def int64_div(dividend: int, divisor: int) -> int:
    """Go's integer division: truncates toward zero (Python's `//` floors)."""
    quotient = abs(dividend) // abs(divisor)
    return quotient if (dividend < 0) == (divisor < 0) else -quotient


def _float_to_int64_bits(value: float) -> int:
    if math.isnan(value) or not _I64_MIN <= value < 2**63:
        return _I64_INDEFINITE
    return math.trunc(value) % _U64


def float_to_uint64(value: float) -> int:
    """`uint(f)` on amd64: below 2^63 through a signed conversion (so negatives wrap), above it
    by subtracting 2^63 first; out of range gives the 'integer indefinite' bit pattern."""
    if value < 2**63:
        return _float_to_int64_bits(value)
    return _float_to_int64_bits(value - 2**63) ^ _I64_INDEFINITE


def float_to_int64(value: float) -> int:
    """`int64(f)` on amd64: truncation; out of range or NaN gives math.MinInt64."""
    return int64(_float_to_int64_bits(value))
