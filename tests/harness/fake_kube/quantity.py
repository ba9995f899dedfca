"""Kubernetes resource quantities ("500m", "64Gi", "1e3") as exact Decimals."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a quantity; raise ValueError on text the API server would refuse."""
    if isinstance(value, int | float):
        return Decimal(str(value))
    match = _QUANTITY_RE.match(value.strip())
    if match is None:
        raise ValueError(f"quantities must match the regular expression: {value!r}")
    number, suffix = match.groups()
    try:
        amount = Decimal(number)
    except InvalidOperation as err:
        raise ValueError(f"invalid quantity {value!r}") from err
    if suffix in _BINARY:
        return amount * _BINARY[suffix]
    return amount * _DECIMAL[suffix]
