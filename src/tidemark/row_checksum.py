"""Row checksums that a source database and a Delta table compute alike, so that
``tidemark verify`` compares a target with its source without reading matching rows.

Both sides turn each row into the same text, hash it, and sum the hashes of the rows
whose key falls into a bucket. Each side computes this where its data is: the source
database in SQL (``source/<kind>/checksum.py``), the Delta table with DuckDB
(``lake/delta_checksum.py``). This module is the specification they follow and a
reference implementation in Python that tests hold every dialect to.

**A column value's canonical text** depends on the type of the target's column (the
Arrow type of the Delta column), because that is the form both sides can reach:

=====================  ==============================================================
target type            canonical text
=====================  ==============================================================
integers               decimal digits, ``-`` for negatives (``-12``, ``0``)
boolean                ``t`` or ``f``
decimal(p, s)          plain notation with exactly *s* fraction digits (``-1.50``,
                       ``0.00``, ``12``); never an exponent; ``-0.00`` is ``0.00``
float64                the 16 lower-case hex digits of its IEEE 754 binary64 bits
                       (1.5 → ``3ff8000000000000``, -0.0 → ``8000000000000000``);
                       ``NaN`` for every NaN. Exact on every side, unlike a
                       shortest decimal text: PostgreSQL's (Ryu without its
                       bounds) and Python's or DuckDB's differ for some doubles
                       above 2^51 (``6.9830165215099616e+16`` against
                       ``6.983016521509962e+16``)
float32                the value widened to float64 (exactly), then as float64
string                 the text itself
binary                 lower-case hex of the bytes
date                   days since 1970-01-01 (``-1``, ``19723``)
timestamp              microseconds since 1970-01-01 00:00:00 (UTC for an instant,
                       the wall clock for a timestamp without zone)
time                   microseconds since midnight
list                   ``[`` + each element encoded as a field (below) + ``]``
=====================  ==============================================================

Other target types (structs, maps) have no canonical text: a verify of such a column
is refused with an error naming it.

**A row's text** is the concatenation of its compared columns' fields, in the order
the caller gives. A field is ``~`` for NULL; otherwise a string is ``<n>:<text>`` with
*n* the text's length in characters, a list is its text (``[`` … ``]``, which its
brackets delimit), and any other value is its text followed by ``,``. Knowing the
columns' types, a row text reads back into its fields without an escape: the length
prefix keeps ``("a", "bc")`` and ``("ab", "c")`` apart, and no other type's text
holds a ``,`` or starts with ``~`` or ``]``. (Only strings carry a length: computing
one costs a database a second evaluation of the value's text, which for most types
is most of a row's cost.)

**Hashes**: the MD5 of the UTF-8 bytes of a text, its first 15 hex digits read as an
unsigned integer (60 bits, so a sum of a billion of them fits in a signed 128-bit
integer and every dialect's exact numeric type). A row's hash is that of its row
text over all compared columns. Its key hash is that of the row text of its key
columns alone (in the key's order), except for a key of one integer column whose
value *v* is in [0, 2^60): its key hash is *v* itself, which spares every side an
MD5 a row and names the key exactly.

**Buckets**: a row belongs to bucket ``key_hash mod n`` of *n* buckets. A bucket's
checksum is its row count and the exact sum of its rows' hashes. Splitting bucket *b*
of *n* into *m* parts gives buckets ``b + i·n`` of ``n·m`` (``key_hash mod n·m``),
so both sides refine the same bucket the same way. Hashing keys instead of ordering
them keeps text keys clear of collation differences between the database and DuckDB.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import functools
import hashlib
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Protocol, runtime_checkable

import pyarrow as pa

#: Hex digits of the MD5 a hash keeps (60 bits).
HASH_HEX_DIGITS: Final = 15
#: The text of a NULL field.
NULL_FIELD: Final = "~"
#: What follows the text of a field that is neither a string nor a list.
FIELD_END: Final = ","
#: Integer keys below this are their own key hash (see the module docstring).
INTEGER_KEY_LIMIT: Final = 2**60

_EPOCH_DATE: Final = dt.date(1970, 1, 1)
_EPOCH: Final = dt.datetime(1970, 1, 1)
_EPOCH_UTC: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class UnsupportedColumnError(TypeError):
    """A target column whose type has no canonical text (it cannot be checksummed)."""


@dataclasses.dataclass(frozen=True)
class BucketSum:
    """One bucket's checksum: its row count and the exact sum of its row hashes."""

    rows: int
    total: int


#: Bucket number -> its checksum; buckets without rows are absent.
BucketSums = dict[int, BucketSum]


@dataclasses.dataclass(frozen=True)
class ComparedColumn:
    """A column both sides compare: its name and the Arrow type of the target's column
    (which decides its canonical text)."""

    name: str
    target_type: pa.DataType


@dataclasses.dataclass(frozen=True)
class TableShape:
    """What is compared of one table: *columns* in the order their fields are joined
    (key columns included), and *keys*, the key columns' names in the key's order."""

    columns: tuple[ComparedColumn, ...]
    keys: tuple[str, ...]


#: A row's fields as canonical texts (None: NULL), in TableShape.columns' order.
RowTexts = tuple[str | None, ...]
#: A fetched row: its key hash and its canonical fields.
KeyedRow = tuple[int, RowTexts]


class ChecksumSide(Protocol):
    """One side of a comparison, fixed at one state of the table (a database snapshot,
    a Delta table version) for as long as it is open."""

    def bucket_sums(self, shape: TableShape, buckets: int, *,
                    only: Sequence[int] | None = None,
                    excluded_keys: frozenset[int] = frozenset()) -> BucketSums:
        """The checksum of each bucket of *buckets* (only those listed in *only*, when
        given), leaving out rows whose key hash is in *excluded_keys*."""
        ...

    def bucket_rows(self, shape: TableShape, buckets: int, only: Sequence[int], *,
                    excluded_keys: frozenset[int] = frozenset()) -> list[KeyedRow]:
        """Every row in the listed buckets (one entry per row: a key held twice is
        there twice), as its key hash and canonical fields."""
        ...


@runtime_checkable
class KeyLookup(Protocol):
    """A :class:`ChecksumSide` that can also find rows by their key values, which
    spares a scan of the whole table when only a few keys are compared (a later
    round's keys)."""

    def key_rows(self, shape: TableShape,
                 keys: Sequence[RowTexts]) -> list[KeyedRow] | None:
        """The rows whose key columns' canonical texts (in ``shape.keys`` order) are
        one of *keys*, found by value (an index, file statistics), as
        :meth:`ChecksumSide.bucket_rows` gives them; it may return more rows than asked
        for (the caller keeps those whose key hash it wants). None when this side
        cannot look these keys up by value (a key type it cannot turn back into a
        value, a NULL key): the caller then fetches them by key hash."""
        ...


def supported(target_type: pa.DataType) -> bool:
    """True if a column of *target_type* has a canonical text."""
    if pa.types.is_list(target_type) or pa.types.is_large_list(target_type):
        return supported(target_type.value_type)
    return any(check(target_type) for check in (
        pa.types.is_integer, pa.types.is_boolean, pa.types.is_decimal,
        pa.types.is_floating, pa.types.is_string, pa.types.is_large_string,
        pa.types.is_binary, pa.types.is_large_binary, pa.types.is_date,
        pa.types.is_timestamp, pa.types.is_time)) or _is_string_view(target_type)


def _is_string_view(target_type: pa.DataType) -> bool:
    check = getattr(pa.types, "is_string_view", None)
    return bool(check is not None and check(target_type))


def float_text(value: float) -> str:
    """The canonical text of a float64 (see the module docstring)."""
    if math.isnan(value):
        return "NaN"
    return struct.pack(">d", value).hex()


def decimal_text(value: decimal.Decimal, scale: int) -> str:
    """The canonical text of a decimal of *scale* fraction digits."""
    # Enough digits for the whole value at its scale (the default context keeps 28:
    # a decimal(30, 0) would not quantize).
    context = decimal.Context(prec=max(28, value.adjusted() + max(scale, 0) + 2))
    quantized = value.quantize(decimal.Decimal(1).scaleb(-scale), context=context) \
        if scale > 0 else value.quantize(decimal.Decimal(1), context=context)
    if quantized.is_zero():
        quantized = abs(quantized)
    return f"{quantized:f}"


def value_text(value: Any, target_type: pa.DataType) -> str | None:
    """The canonical text of a Python *value* of a target column of *target_type*
    (None for NULL); raises UnsupportedColumnError for types without one."""
    if value is None:
        return None
    if pa.types.is_list(target_type) or pa.types.is_large_list(target_type):
        return "[" + "".join(field(value_text(v, target_type.value_type),
                                   target_type.value_type) for v in value) + "]"
    if pa.types.is_boolean(target_type):
        return "t" if value else "f"
    if pa.types.is_integer(target_type):
        return str(int(value))
    if pa.types.is_decimal(target_type):
        return decimal_text(decimal.Decimal(value), target_type.scale)
    if pa.types.is_floating(target_type):
        return float_text(float(value))
    if pa.types.is_string(target_type) or pa.types.is_large_string(target_type) \
            or _is_string_view(target_type):
        return str(value)
    if pa.types.is_binary(target_type) or pa.types.is_large_binary(target_type):
        return bytes(value).hex()
    if pa.types.is_date(target_type):
        return str((value - _EPOCH_DATE).days)
    if pa.types.is_timestamp(target_type):
        epoch = _EPOCH_UTC if value.tzinfo is not None else _EPOCH
        delta = value - epoch
        return str((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)
    if pa.types.is_time(target_type):
        return str(((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
                   + value.microsecond)
    raise UnsupportedColumnError(f"no canonical text for target type {target_type}")


def is_list(target_type: pa.DataType) -> bool:
    """True for a list column (its text is ``[`` … ``]``)."""
    return bool(pa.types.is_list(target_type) or pa.types.is_large_list(target_type))


def is_string(target_type: pa.DataType) -> bool:
    """True for a string column (its field carries its length)."""
    return bool(pa.types.is_string(target_type) or pa.types.is_large_string(target_type)
                or _is_string_view(target_type))


def field(text: str | None, target_type: pa.DataType) -> str:
    """A canonical text of a column of *target_type* as a field of a row text."""
    if text is None:
        return NULL_FIELD
    if is_string(target_type):
        return f"{len(text)}:{text}"
    if is_list(target_type):
        return text
    return text + FIELD_END


def row_text(texts: Iterable[str | None], types: Iterable[pa.DataType]) -> str:
    """The row text of canonical field texts of columns of *types*."""
    return "".join(field(t, kind) for t, kind in zip(texts, types, strict=True))


def text_hash(text: str) -> int:
    """The 60-bit hash of a row or key text."""
    return int(hashlib.md5(text.encode("utf-8")).hexdigest()[:HASH_HEX_DIGITS], 16)


def row_hash(texts: RowTexts, shape: TableShape) -> int:
    """The hash of a row's canonical fields (all of *shape*'s columns)."""
    return text_hash(row_text(texts, (c.target_type for c in shape.columns)))


@functools.lru_cache(maxsize=64)  # asked for every row a source hashes in Python
def integer_key(shape: TableShape) -> bool:
    """True if *shape*'s key is one integer column (its values below
    :data:`INTEGER_KEY_LIMIT` are their own key hash)."""
    if len(shape.keys) != 1:
        return False
    return any(c.name == shape.keys[0] and pa.types.is_integer(c.target_type)
               for c in shape.columns)


@functools.lru_cache(maxsize=64)
def key_types(shape: TableShape) -> tuple[pa.DataType, ...]:
    """The target types of *shape*'s key columns, in the key's order."""
    by_name = {c.name: c.target_type for c in shape.columns}
    return tuple(by_name[k] for k in shape.keys)


def key_hash(key_texts: Sequence[str | None], shape: TableShape) -> int:
    """The key hash of a row whose key columns' canonical texts (in ``shape.keys``'
    order) are *key_texts*."""
    if integer_key(shape) and key_texts[0] is not None:
        value = int(key_texts[0])
        if 0 <= value < INTEGER_KEY_LIMIT:
            return value
    return text_hash(row_text(key_texts, key_types(shape)))


def row_texts(row: Mapping[str, Any], shape: TableShape) -> RowTexts:
    """The canonical fields of a row given as Python values by column name."""
    return tuple(value_text(row[c.name], c.target_type) for c in shape.columns)


def key_hash_of(texts: RowTexts, shape: TableShape) -> int:
    """The key hash of a row's canonical fields (all of *shape*'s columns)."""
    position = {c.name: i for i, c in enumerate(shape.columns)}
    return key_hash([texts[position[k]] for k in shape.keys], shape)


def reference_bucket_sums(rows: Iterable[Mapping[str, Any]], shape: TableShape,
                          buckets: int) -> BucketSums:
    """The bucket checksums of Python rows, computed here (the reference every dialect
    is tested against)."""
    counts: dict[int, list[int]] = {}
    for row in rows:
        texts = row_texts(row, shape)
        bucket = key_hash_of(texts, shape) % buckets
        entry = counts.setdefault(bucket, [0, 0])
        entry[0] += 1
        entry[1] += row_hash(texts, shape)
    return {b: BucketSum(n, total) for b, (n, total) in counts.items()}
