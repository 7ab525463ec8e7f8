"""Parsers of the scalar text forms: booleans, numbers, ``money``, ``bytea``, ``uuid``,
``inet``/``cidr``."""

from __future__ import annotations

import ipaddress
from decimal import Decimal
from typing import Final, TypeAlias
from uuid import UUID

#: What :func:`parse_inet` returns.
InetValue: TypeAlias = (
    ipaddress.IPv4Interface
    | ipaddress.IPv6Interface
    | ipaddress.IPv4Address
    | ipaddress.IPv6Address
)

_BOOL_VALUES: Final[dict[str, bool]] = {"t": True, "f": False, "true": True, "false": False}


def parse_bool(text: str) -> bool:
    """``'t'`` -> ``True``, ``'f'`` -> ``False`` (``'true'``/``'false'`` also accepted)."""
    try:
        return _BOOL_VALUES[text]
    except KeyError:
        raise ValueError(f"invalid boolean: {text!r}") from None


def parse_int(text: str) -> int:
    """An ``int2``, ``int4``, ``int8`` or ``oid`` value."""
    return int(text)


def parse_float(text: str) -> float:
    """A ``float4``/``float8`` value; ``'NaN'``, ``'Infinity'``, ``'-Infinity'`` included.

    With ``extra_float_digits=3`` (or the PostgreSQL 12+ default of 1) the server
    prints the shortest text that round-trips, so ``float8`` values are exact.
    """
    return float(text)


def parse_numeric(text: str) -> Decimal:
    """A ``numeric`` value, exactly; ``'NaN'``, ``'Infinity'``, ``'-Infinity'`` included.

    The infinities exist from PostgreSQL 14 on.
    """
    return Decimal(text)


def parse_money(text: str) -> Decimal:
    """A ``money`` value as printed with ``lc_monetary=C``: ``'$1,234.56'``, ``'-$1,234.56'``.

    Other locales' symbols and separators are not recognised; a parenthesised negative
    amount (``'($1.00)'``, used by some locales) is.
    """
    cleaned = text.replace("$", "").replace(",", "")
    if cleaned.startswith("(") and cleaned.endswith(")"):
        cleaned = "-" + cleaned[1:-1]
    try:
        return Decimal(cleaned)
    except ArithmeticError:  # decimal.InvalidOperation, which is not a ValueError
        raise ValueError(f"invalid money value: {text!r}") from None


def parse_bytea(text: str) -> bytes:
    """A ``bytea`` value: ``'\\x0a0b'`` (hex format) -> ``b'\\n\\x0b'``.

    The legacy ``escape`` format (``bytea_output=escape``) is accepted too.
    """
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    return _parse_bytea_escape(text)


def _parse_bytea_escape(text: str) -> bytes:
    # Escape format: printable ASCII as itself, '\\' for a backslash, '\ooo' (octal)
    # for every other byte.
    out = bytearray()
    pos = 0
    while True:
        backslash = text.find("\\", pos)
        if backslash < 0:
            out += text[pos:].encode("ascii")
            return bytes(out)
        out += text[pos:backslash].encode("ascii")
        if text.startswith("\\", backslash + 1):
            out.append(0x5C)
            pos = backslash + 2
            continue
        octal = text[backslash + 1 : backslash + 4]
        if len(octal) != 3 or not all("0" <= ch <= "7" for ch in octal):
            raise ValueError(f"invalid bytea escape sequence in {text!r}")
        out.append(int(octal, 8))
        pos = backslash + 4


def parse_uuid(text: str) -> UUID:
    """A ``uuid`` value."""
    return UUID(text)


def parse_inet(text: str) -> InetValue:
    """An ``inet`` value: an address, or an interface when a netmask is printed.

    The output function omits a full-length mask (``'192.168.0.1'``) and prints any
    other (``'192.168.0.1/24'``), so this returns ``ip_address`` or ``ip_interface``.
    """
    if "/" in text:
        return ipaddress.ip_interface(text)
    return ipaddress.ip_address(text)


def parse_cidr(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A ``cidr`` value (always printed with its mask) as an ``ip_network``."""
    return ipaddress.ip_network(text)
