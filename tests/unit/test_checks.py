"""The shared value checks (`pollux.checks`): what each accepts, and one wording for the rest."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux import checks


@settings(deadline=None)
@given(st.integers(), st.integers(-5, 5), st.integers(-5, 5))
def test_a_whole_number_is_taken_exactly_within_its_bounds(value: int, low: int, span: int) -> None:
    high = low + abs(span)
    if low <= value <= high:
        assert checks.whole_number(value, least=low, most=high) == value
        return
    with pytest.raises(checks.Problem) as caught:
        checks.whole_number(value, least=low, most=high)
    assert caught.value.requirement == f"must be a whole number ≥ {low} and ≤ {high}"
    assert str(caught.value) == f"{caught.value.requirement}, got int {value}"


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None, [1], np.int64(1)])
def test_only_an_int_is_a_whole_number_by_default(value: object) -> None:
    with pytest.raises(checks.Problem, match="must be a whole number, got"):
        checks.whole_number(value)


@pytest.mark.parametrize("value", [2.0, np.int64(2), np.float32(2.0)])
def test_integer_valued_reals_are_whole_numbers_when_asked(value: object) -> None:
    got = checks.whole_number(value, reals=True)
    assert (got, type(got)) == (2, int)


@pytest.mark.parametrize("value", [2.5, math.nan, math.inf, True])
def test_other_reals_are_not(value: object) -> None:
    with pytest.raises(checks.Problem):
        checks.whole_number(value, reals=True)


@settings(deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_real_number_is_finite_and_above_its_bound(value: float) -> None:
    if math.isfinite(value) and value > 0:
        assert checks.real_number(value, above=0) == value
        return
    with pytest.raises(checks.Problem) as caught:
        checks.real_number(value, above=0)
    assert caught.value.requirement == "must be a finite number > 0"


def test_a_bool_is_never_a_number() -> None:
    with pytest.raises(checks.Problem, match=r"must be a finite number, got bool True"):
        checks.real_number(True)


def test_text_and_the_callers_own_error() -> None:
    assert checks.text("") == ""
    with pytest.raises(checks.Problem, match=r"must be a non-empty string, got str ''"):
        checks.text("", non_empty=True)

    class FieldError(Exception):
        pass

    with pytest.raises(FieldError, match=r"^x: must be a string, got nothing$"):
        checks.text(None, error=lambda problem: FieldError(f"x: {problem}"))


def test_a_long_value_is_described_cut_short() -> None:
    assert checks.described("a" * 100) == "str " + repr("a" * 64) + "… (100 chars)"
    assert checks.described([1, 2]) == "list"
    assert checks.described(None) == "nothing"
