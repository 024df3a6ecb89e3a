"""Go's fixed-width integer and float conversions, for compat="volcano".

Volcano keeps GPU counters in `uint` and requests in `int32`; where a value wraps, Go's
arithmetic, not the mathematical one, decides a fit or a score. These helpers give the exact
results of Go's conversions on amd64 (the platform Volcano ships for).
"""

from __future__ import annotations

import math

_U64 = 2**64
_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1
_I64_INDEFINITE = 2**63  # what amd64's float->int64 conversion gives out of range or for NaN


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
