"""The one Kubernetes quantity parser: every form the apiserver accepts, read exactly."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tessera.models.quantity import parse_quantity, quantity_value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Ki", Fraction(2**10)),
        ("81559Mi", Fraction(81559 * 2**20)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("2Ti", Fraction(2 * 2**40)),
        ("1Pi", Fraction(2**50)),
        ("1Ei", Fraction(2**60)),
        ("1k", Fraction(1000)),
        ("3M", Fraction(3 * 10**6)),
        ("10G", Fraction(10**10)),
        ("1T", Fraction(10**12)),
        ("100", Fraction(100)),
        ("500m", Fraction(1, 2)),
        ("250u", Fraction(1, 4000)),
        ("5n", Fraction(5, 10**9)),
        ("0.1", Fraction(1, 10)),
        ("1.", Fraction(1)),
        (".5", Fraction(1, 2)),
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),
        ("2.5e-3", Fraction(1, 400)),
        ("1e+2", Fraction(100)),
        ("+4", Fraction(4)),
        ("-1.5Gi", Fraction(-3 * 2**29)),
        (" 40Gi ", Fraction(40 * 2**30)),
        (7, Fraction(7)),
    ],
)
def test_quantities_are_read_by_exact_value(text: str | int, value: Fraction) -> None:
    assert quantity_value(text) == value


@pytest.mark.parametrize(
    "text", ["", "four gigs", "Gi", "1gi", "1KiB", "1 Gi", "1e", "1.2.3", "--1", "1Gi1", "e3", "1i", "."]
)
def test_a_malformed_quantity_is_a_value_error_that_shows_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a quantity: write a number with an optional suffix .* such as 4Gi"):
        quantity_value(text)


def test_a_bool_is_not_a_quantity() -> None:
    with pytest.raises(ValueError, match="is not a quantity"):
        quantity_value(True)


@pytest.mark.parametrize(
    ("text", "whole"),
    [("40Gi", 40 * 2**30), ("1.5Ki", 1536), ("0.1", 1), ("500m", 1), ("1e3", 1000), ("10G", 10**10), ("0", 0)],
)
def test_parse_quantity_rounds_up_to_a_whole_unit(text: str, whole: int) -> None:
    assert parse_quantity(text) == whole
