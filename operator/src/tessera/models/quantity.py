"""Kubernetes resource quantities ("40Gi", "10G", "500m", "1e3") and Go durations ("1h30m").

The one quantity parser: :func:`quantity_value` reads any quantity the apiserver accepts
(sign, decimals, ``n``/``u``/``m``, ``k``…``E``, ``Ki``…``Ei``, exponents) exactly, and
:func:`parse_quantity` rounds that up to whole bytes or units. ``Quantity`` (in the CRDs) takes
only the plain forms users write; the canonical string a quantity is published with comes
from ``format_bytes``. Not a general arbitrary-precision quantity type (no arithmetic, no
canonical formatting of fractions).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Annotated

from pydantic import AfterValidator, Field

_SUFFIXES: dict[str, int] = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
# Everything the apiserver reads as a quantity: a signed decimal number ("1", "1.", ".5"),
# then a binary or decimal suffix or a decimal exponent ("1e3", "1E-3").
_ANY_QUANTITY_RE = re.compile(
    r"^([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$"
)
_SCALE: dict[str, Fraction] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    **{suffix: Fraction(unit) for suffix, unit in _SUFFIXES.items()},
}

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(h|m|s|ms))+$"
_DURATION_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(h|ms|m|s)")
_DURATION_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def quantity_value(text: str | int) -> Fraction:
    """The exact value of a Kubernetes quantity: ``"81559Mi"``, ``"100"``, ``"500m"``, ``"1e3"``,
    ``"-1.5Gi"``; a ValueError that says how to write one when ``text`` is not a quantity."""
    if isinstance(text, int) and not isinstance(text, bool):
        return Fraction(text)
    match = _ANY_QUANTITY_RE.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"{text!r} is not a quantity: write a number with an optional suffix (Ki, Mi, Gi, Ti, Pi, Ei, "
            "n, u, m, k, M, G, T, P, E) or exponent, such as 4Gi, 512Mi, 10G, 500m or 1e3"
        )
    sign, number, exponent, suffix = match.groups()
    value = Fraction(number.removesuffix("."))
    if exponent:
        value *= Fraction(10) ** int(exponent[1:])
    else:
        value *= _SCALE[suffix or ""]
    return -value if sign == "-" else value


def parse_quantity(text: str) -> int:
    """Bytes (or units) in a quantity such as ``"40Gi"``; fractions round up to a whole unit."""
    return math.ceil(quantity_value(text))


def format_bytes(value: int) -> str:
    """The shortest exact binary-suffixed form: 42949672960 → ``"40Gi"``."""
    if value == 0:
        return "0"
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _SUFFIXES[suffix]
        if value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration such as ``"1h30m"`` or ``"90s"``."""
    stripped = text.strip()
    if not re.fullmatch(DURATION_PATTERN, stripped):
        raise ValueError(f"{text!r} is not a duration: write it like 90s, 15m or 1h30m")
    return sum(float(n) * _DURATION_SECONDS[u] for n, u in _DURATION_PART_RE.findall(stripped))


def _check_quantity(text: str) -> str:
    parse_quantity(text)
    return text


def _check_duration(text: str) -> str:
    parse_duration(text)
    return text


Quantity = Annotated[
    str,
    Field(pattern=QUANTITY_PATTERN, max_length=64, examples=["4Gi"]),
    AfterValidator(_check_quantity),
]
Duration = Annotated[
    str,
    Field(pattern=DURATION_PATTERN, max_length=64, examples=["1h"]),
    AfterValidator(_check_duration),
]

MIB = 2**20
