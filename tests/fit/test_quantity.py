"""Kubernetes resource quantities: exact parsing, `Value()` (round up) and `AsInt64()` (exact ints).

The grammar is Kubernetes' own: `<sign><digits>[.<digits>]` (also `<digits>.` and `.<digits>`)
followed by nothing, a binary suffix (Ki Mi Gi Ti Pi Ei), a decimal suffix (n u m k M G T P E) or
a decimal exponent (`e`/`E` and a signed integer). JSON numbers are accepted as the API serves them.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any

import pytest

from deviceplugin.fit import FitInputError, QuantityError, parse_quantity
from deviceplugin.fit.quantity import go_quantity_as_int64, quantity_as_int64, quantity_ceil
from tests.fit import volcano_go as go

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


# --- parse_quantity: exact values ------------------------------------------------------------

PLAIN = [
    pytest.param("0", Fraction(0), id="zero"),
    pytest.param("1", Fraction(1), id="one"),
    pytest.param("1024", Fraction(1024), id="plain-int"),
    pytest.param("007", Fraction(7), id="leading-zeros"),
    pytest.param("0.5", Fraction(1, 2), id="decimal"),
    pytest.param(".5", Fraction(1, 2), id="leading-dot"),
    pytest.param("5.", Fraction(5), id="trailing-dot"),
    pytest.param("1.25", Fraction(5, 4), id="two-decimals"),
    pytest.param("+5", Fraction(5), id="plus-sign"),
    pytest.param("-5", Fraction(-5), id="minus-sign"),
    pytest.param("-.5", Fraction(-1, 2), id="minus-leading-dot"),
    pytest.param("+0", Fraction(0), id="plus-zero"),
    pytest.param("-0", Fraction(0), id="minus-zero"),
]

BINARY_SUFFIXES = [
    pytest.param("1Ki", Fraction(2**10), id="Ki"),
    pytest.param("1Mi", Fraction(2**20), id="Mi"),
    pytest.param("16Gi", Fraction(16 * 2**30), id="Gi"),
    pytest.param("1Ti", Fraction(2**40), id="Ti"),
    pytest.param("1Pi", Fraction(2**50), id="Pi"),
    pytest.param("1Ei", Fraction(2**60), id="Ei"),
    pytest.param("1.5Gi", Fraction(3 * 2**29), id="fractional-Gi"),
    pytest.param(".5Ki", Fraction(512), id="leading-dot-Ki"),
    pytest.param("-2Mi", Fraction(-2 * 2**20), id="negative-Mi"),
]

DECIMAL_SUFFIXES = [
    pytest.param("1n", Fraction(1, 10**9), id="n"),
    pytest.param("1u", Fraction(1, 10**6), id="u"),
    pytest.param("500m", Fraction(1, 2), id="m"),
    pytest.param("1500m", Fraction(3, 2), id="m-above-one"),
    pytest.param("1k", Fraction(10**3), id="k"),
    pytest.param("1M", Fraction(10**6), id="M"),
    pytest.param("1G", Fraction(10**9), id="G"),
    pytest.param("1T", Fraction(10**12), id="T"),
    pytest.param("1P", Fraction(10**15), id="P"),
    pytest.param("2E", Fraction(2 * 10**18), id="E-is-exa"),
    pytest.param("1.5k", Fraction(1500), id="fractional-k"),
    pytest.param("+3m", Fraction(3, 1000), id="plus-m"),
]

EXPONENTS = [
    pytest.param("1e3", Fraction(1000), id="e3"),
    pytest.param("1E3", Fraction(1000), id="E3"),
    pytest.param("1e+3", Fraction(1000), id="e+3"),
    pytest.param("1e-3", Fraction(1, 1000), id="e-3"),
    pytest.param("1e0", Fraction(1), id="e0"),
    pytest.param("2.5e2", Fraction(250), id="decimal-mantissa"),
    pytest.param(".5e1", Fraction(5), id="leading-dot-mantissa"),
    pytest.param("-1e2", Fraction(-100), id="negative-mantissa"),
    pytest.param("12e-1", Fraction(6, 5), id="negative-exponent-fraction"),
    pytest.param("1e18", Fraction(10**18), id="e18"),
]


@pytest.mark.parametrize(("text", "expected"), PLAIN + BINARY_SUFFIXES + DECIMAL_SUFFIXES + EXPONENTS)
def test_parse_quantity_string_is_exact(text: str, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(0, Fraction(0), id="int-zero"),
        pytest.param(7, Fraction(7), id="int"),
        pytest.param(-3, Fraction(-3), id="negative-int"),
        pytest.param(2**70, Fraction(2**70), id="big-int"),
        pytest.param(2.5, Fraction(5, 2), id="float"),
        pytest.param(1.0, Fraction(1), id="integral-float"),
        pytest.param(0.1, Fraction(1, 10), id="float-read-as-its-decimal-text"),
        pytest.param(1e20, Fraction(10**20), id="float-exponent"),
        pytest.param(-0.5, Fraction(-1, 2), id="negative-float"),
    ],
)
def test_parse_quantity_json_numbers(value: int | float, expected: Fraction) -> None:
    assert parse_quantity(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty"),
        pytest.param("1.2.3", id="two-dots"),
        pytest.param("1Kb", id="unknown-suffix-Kb"),
        pytest.param("Mi", id="suffix-without-number"),
        pytest.param("1 Gi", id="space-before-suffix"),
        pytest.param(" 1", id="leading-space"),
        pytest.param("1 ", id="trailing-space"),
        pytest.param("1ki", id="lowercase-ki"),
        pytest.param("1KI", id="uppercase-KI"),
        pytest.param("1K", id="uppercase-K"),
        pytest.param("1i", id="bare-i"),
        pytest.param("1mi", id="lowercase-mi"),
        pytest.param(".", id="lone-dot"),
        pytest.param("-", id="lone-sign"),
        pytest.param("+-1", id="two-signs"),
        pytest.param("--1", id="double-minus"),
        pytest.param("e3", id="exponent-without-mantissa"),
        pytest.param("1e", id="e-without-digits"),
        pytest.param("1e+", id="signed-e-without-digits"),
        pytest.param("1e3.5", id="fractional-exponent"),
        pytest.param("1e3Gi", id="exponent-and-suffix"),
        pytest.param("1Gi2", id="digits-after-suffix"),
        pytest.param("0x10", id="hex"),
        pytest.param("1_000", id="underscore"),
        pytest.param("1,5", id="comma-decimal"),
        pytest.param("NaN", id="nan-text"),
        pytest.param("Infinity", id="infinity-text"),
        pytest.param(True, id="bool-true"),
        pytest.param(False, id="bool-false"),
        pytest.param(None, id="none"),
        pytest.param([], id="list"),
        pytest.param({}, id="dict"),
        pytest.param(b"1", id="bytes"),
        pytest.param(float("nan"), id="float-nan"),
        pytest.param(float("inf"), id="float-inf"),
        pytest.param(float("-inf"), id="float-minus-inf"),
    ],
)
def test_parse_quantity_rejects_garbage(value: Any) -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity(value)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, FitInputError)
    assert repr(value) in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("\u0661", id="arabic-indic-one"),
        pytest.param("\uff11Gi", id="fullwidth-one-Gi"),
    ],
)
def test_parse_quantity_rejects_non_ascii_digits(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


# --- quantity_ceil: Kubernetes Value() -------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("0.5", 1, id="half-rounds-up"),
        pytest.param("1500m", 2, id="1500m-rounds-up"),
        pytest.param("1", 1, id="exact-one"),
        pytest.param("2Ki", 2048, id="2Ki"),
        pytest.param("0", 0, id="zero"),
        pytest.param("1n", 1, id="one-nano-rounds-up"),
        pytest.param("1000m", 1, id="1000m-is-exact"),
        pytest.param("1.0001", 2, id="just-above-one"),
        pytest.param("1e3", 1000, id="exponent"),
        pytest.param("1e-3", 1, id="negative-exponent-rounds-up"),
        pytest.param("16Gi", 16 * 2**30, id="16Gi"),
        pytest.param(3, 3, id="json-int"),
        pytest.param(0.1, 1, id="json-float"),
    ],
)
def test_quantity_ceil_rounds_up(value: object, expected: int) -> None:
    assert quantity_ceil(value) == expected


@pytest.mark.parametrize("value", [pytest.param("1Kb", id="bad-suffix"), pytest.param(None, id="none")])
def test_quantity_ceil_propagates_parse_errors(value: object) -> None:
    with pytest.raises(QuantityError):
        quantity_ceil(value)


# --- quantity_as_int64: Kubernetes AsInt64() -------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("1k", 1000, id="1k"),
        pytest.param("1e3", 1000, id="1e3"),
        pytest.param("16Gi", 16 * 2**30, id="16Gi"),
        pytest.param("0", 0, id="zero"),
        pytest.param("42", 42, id="plain"),
        pytest.param("-7", -7, id="negative"),
        pytest.param("1E", 10**18, id="exa"),
        pytest.param(str(INT64_MAX), INT64_MAX, id="int64-max"),
        pytest.param(str(INT64_MIN), INT64_MIN, id="int64-min"),
        pytest.param(5, 5, id="json-int"),
        pytest.param(2.0, 2, id="json-integral-float"),
        pytest.param("0.5", None, id="half"),
        pytest.param("1500m", None, id="fractional-milli"),
        pytest.param("1n", None, id="nano"),
        pytest.param("1e-3", None, id="negative-exponent"),
        pytest.param(str(INT64_MAX + 1), None, id="above-int64-max"),
        pytest.param(str(INT64_MIN - 1), None, id="below-int64-min"),
        pytest.param("8Ei", None, id="8Ei-is-2^63"),
        pytest.param("10E", None, id="10E-beyond-int64"),
        pytest.param("1e19", None, id="1e19-beyond-int64"),
        pytest.param(2.5, None, id="json-fractional-float"),
        pytest.param(2**63, None, id="json-int-beyond-int64"),
    ],
)
def test_quantity_as_int64(value: object, expected: int | None) -> None:
    assert quantity_as_int64(value) == expected


def test_quantity_as_int64_propagates_parse_errors() -> None:
    with pytest.raises(QuantityError):
        quantity_as_int64("1 Gi")


# --- go_quantity_as_int64: Go's AsInt64 of what ParseQuantity builds (compat="volcano") ---------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("0", 0, id="zero"),
        pytest.param("0000000000000000000001", 1, id="leading-zeros-are-not-digits"),
        pytest.param("999999999999999999", 999_999_999_999_999_999, id="18-digits-fast-path"),
        pytest.param("1000000000000000000", None, id="19-digits-arbitrary-precision"),
        pytest.param("5.", 5, id="empty-fraction"),
        pytest.param("1.0", None, id="a-fraction-digit-makes-scale-negative"),
        pytest.param("2000m", None, id="milli-is-scale-minus-3"),
        pytest.param("1n", None, id="nano"),
        pytest.param("1e3", 1000, id="exponent"),
        pytest.param("1E3", 1000, id="capital-exponent"),
        pytest.param("123456789012345678e1", 1_234_567_890_123_456_780, id="exponent-18-digits"),
        pytest.param("1e19", None, id="exponent-overflows-int64"),
        pytest.param("9.2E", 9_200_000_000_000_000_000, id="exa-with-fraction"),
        pytest.param("9.3E", None, id="exa-over-int64"),
        pytest.param("1Ti", 2**40, id="tebi"),
        pytest.param("10230Gi", 10230 * 2**30, id="binary-precision-zero"),
        pytest.param("102300Gi", None, id="binary-precision-negative"),
        pytest.param("1Pi", None, id="pebi-is-arbitrary-precision"),
        pytest.param("1.5Gi", None, id="binary-with-fraction"),
        pytest.param("-7", -7, id="negative"),
        pytest.param("+7", 7, id="plus"),
        pytest.param(5, 5, id="json-int"),
        pytest.param(2.0, None, id="json-float-is-text-2.0"),
    ],
)
def test_go_quantity_as_int64(value: object, expected: int | None) -> None:
    assert go_quantity_as_int64(value) == expected


def test_go_quantity_as_int64_agrees_with_the_transcription_of_parse_quantity() -> None:
    rng = random.Random(5)
    suffixes = ["", "", "m", "k", "M", "G", "T", "P", "E", "n", "u", "Ki", "Mi", "Gi", "Pi", "e2", "E-1"]

    def digits(most: int) -> str:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(0, most)))

    checked = 0
    for _ in range(5000):
        whole = "0" * rng.randint(0, 3) + digits(20)
        fraction = "." + digits(4) if rng.random() < 0.3 else ""
        text = rng.choice(["", "-", "+"]) + whole + fraction + rng.choice(suffixes)
        try:
            parse_quantity(text)
        except QuantityError:
            continue
        value, ok = go.parse_quantity(text).as_int64()
        assert go_quantity_as_int64(text) == (value if ok else None), text
        checked += 1
    assert checked > 4000
