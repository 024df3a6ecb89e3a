"""How much annotation and quantity text the readers accept, checked before anything is converted.

An annotation may hold up to 256 KiB, so a hostile pod can put a 100,000-digit number where a GPU
index belongs; converting it would cost a bignum or trip Python's 4,300-digit `int()` limit (a
ValueError that is not a `FitInputError`). Every reader bounds its input by what Kubernetes and
Volcano actually write, so such a value is a clear `FitInputError` naming the field.
"""

from __future__ import annotations

from deviceplugin.fit.errors import FitInputError
from deviceplugin.fit.goint import is_decimal

INT64_DIGITS = 19
"""Digits of a Go int64 (2^63-1 = 9223372036854775807): every number Volcano or this project
writes into an annotation (GPU indices, memory, cores, split counts, Unix times) is a Go `int`,
`int64` or `uint32`, so a longer one was never written by them."""

MAX_QUANTITY_LENGTH = 64
"""Characters of a quantity's text. The API server stores quantities canonically: at most 28
digits (values are capped at 2^63-1 and rounded up to 1e-9), a sign and a suffix of at most 11
characters (`e2147483646`); so 64 leaves room for hand-written forms, and Volcano, which reads
what the API server stores, never sees a longer one."""

MAX_QUANTITY_EXPONENT = 64
"""Largest |exponent| of a quantity read exactly (default mode). Kubernetes' `Value()` saturates
at 2^63-1 (about 9.2e18) and rounds up to 1e-9, so no GPU resource means more, while the exact
value of the exponents Go accepts (up to 2^31) would have billions of digits. compat="volcano"
reads any exponent the way Go does (`go_quantity_value`, `go_quantity_as_int64`)."""

MAX_NODE_GPUS = 1024
"""GPUs per node (registered cards, or a gpushare node's `gpu-number`): servers carry a few dozen
at most; a node object claiming more is malformed, and would make every fit on it walk that many
cards (a `gpu-number` of 1e12 would build 10^12 of them)."""

_SHOWN = 48


def shown(text: str) -> str:
    """`repr(text)` for an error message, clipped: a 256 KiB annotation must not become a 256 KiB
    log line or Event."""
    if len(text) <= _SHOWN + 16:
        return repr(text)
    return f"{text[:_SHOWN]!r}... ({len(text)} characters)"


def parse_decimal(
    text: str,
    what: str,
    error: type[FitInputError],
    *,
    meaning: str,
    kind: str = "a non-negative integer",
    digits: int = INT64_DIGITS,
) -> int:
    """`text` as a non-negative integer: ASCII digits only and at most `digits` of them, counted
    before converting. `what` names the field; the errors read "`what` 'x' is not `kind`" and
    "`what` has 4301 digits; `meaning` has at most 19"."""
    if not is_decimal(text):
        raise error(f"{what} {shown(text)} is not {kind}")
    if len(text) > digits:
        raise error(f"{what} has {len(text)} digits; {meaning} has at most {digits}")
    return int(text)
