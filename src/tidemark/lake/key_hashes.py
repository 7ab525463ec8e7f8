"""Hashing the keys of merge-on-read targets (:func:`key_hashes`), and
:func:`plain_schema`, the Arrow types the key index and the rewrites hold."""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

_U64 = np.dtype(np.uint64)
#: An odd 64-bit constant (2**64 over the golden ratio, Knuth's multiplicative hashing).
_SPREAD = np.uint64(0x9E3779B97F4A7C15)


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """*schema* with delta-rs's string and binary views as plain strings and binaries
    (what Parquet files read as, and what every Arrow kernel takes)."""
    return pa.schema([field.with_type(_plain(field.type)) for field in schema])


def _plain(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_binary_view(kind):
        return pa.binary()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(kind.value_field.with_type(_plain(kind.value_type)))
    return kind


def key_hashes(keys: pa.Table) -> tuple[np.ndarray[Any, np.dtype[np.uint64]], bool]:
    """A 64-bit hash of each row of *keys*, and whether it is exact (one to one with the
    key: one integer column). Inexact hashes are checked against the key values on lookup. Types
    are widened first (every integer to int64, strings and binaries to their plain
    types), so a key hashes the same in a batch and in a file written before a widening."""
    keys = keys.cast(pa.schema([f.with_type(_hash_type(f.type)) for f in keys.schema]))
    if keys.num_columns == 1 and pa.types.is_integer(keys.schema.field(0).type):
        values = np.ascontiguousarray(keys.column(0).to_numpy()).view(_U64)
        # Multiplying by an odd number is one to one modulo 2**64 (exact still) and
        # spreads keys 1..n over the top bits, which place an entry in the lookup's
        # buckets: the keys themselves would all go to the first.
        return values * _SPREAD, True
    con = duckdb.connect()
    try:
        con.register("k", keys)
        names = ", ".join('"' + n.replace('"', '""') + '"' for n in keys.column_names)
        hashes = con.execute(f"SELECT hash({names}) FROM k").to_arrow_table().column(0)
    finally:
        con.close()
    return np.asarray(hashes.to_numpy(), dtype=_U64), False


def _hash_type(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_integer(kind):
        return pa.int64()
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) \
            or pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) \
            or pa.types.is_binary_view(kind):
        return pa.binary()
    return kind
