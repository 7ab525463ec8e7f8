"""The Delta side of verify (tidemark.lake.delta_checksum) against the reference, on
every Arrow type the pipeline writes."""

from __future__ import annotations

import datetime as dt
import decimal
import random
import struct
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tidemark.lake.delta_checksum import DeltaChecksumSide, bits_column, text_sql, with_bits
from tidemark.row_checksum import (
    ComparedColumn,
    TableShape,
    UnsupportedColumnError,
    float_text,
    key_hash_of,
    reference_bucket_sums,
    row_texts,
)

UTC = dt.UTC
#: The Arrow types the pipeline's targets hold (spark/type_mapping.py), edge values each.
COLUMNS: dict[str, tuple[pa.DataType, list[Any]]] = {
    "i16": (pa.int16(), [-32768, 32767, 0]),
    "i32": (pa.int32(), [-2**31, 2**31 - 1, None]),
    "i64": (pa.int64(), [-2**63, 2**63 - 1, 0]),
    "f32": (pa.float32(), [1.5, 0.1, float("nan"), float("inf"), -0.0, 3.4e38, 1e-45]),
    "f64": (pa.float64(), [1e20, 1e-7, 123.0, 5e-324, -0.0, float("nan"), float("-inf"),
                           float("inf"), -2.25e100, 0.1, 1234567890123456.8,
                           2.2250738585072014e-308, None]),
    "dec": (pa.decimal128(10, 3), [decimal.Decimal("-1234.567"), decimal.Decimal("0.000"),
                                   decimal.Decimal("9999999.999"), None]),
    "dec0": (pa.decimal128(38, 0), [decimal.Decimal(10**37), decimal.Decimal(-1), None]),
    "b": (pa.bool_(), [True, False, None]),
    "d": (pa.date32(), [dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1969, 12, 31),
                        dt.date(2024, 2, 29)]),
    "ts": (pa.timestamp("us", tz="UTC"), [dt.datetime(2024, 1, 2, 1, 4, 5, 123456, UTC),
                                          dt.datetime(1, 1, 1, tzinfo=UTC),
                                          dt.datetime(9999, 12, 31, 23, 59, 59, 999999, UTC),
                                          dt.datetime(1969, 12, 31, 23, 59, 59, 999999, UTC)]),
    "ntz": (pa.timestamp("us"), [dt.datetime(1900, 1, 2, 3, 4, 5, 500000),
                                 dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59)]),
    "by": (pa.binary(), [b"\x00\xff", b"", None]),
    "s": (pa.string(), ["é", "", "a b", "日本語", None, "~", "3:abc"]),
    "ai": (pa.list_(pa.int32()), [[1, None, 3], [], None]),
    "at": (pa.list_(pa.string()), [["a b", "c"], [None], ["", "é"]]),
    "af": (pa.list_(pa.float64()), [[1.5, float("nan")], [0.1]]),
    "ad": (pa.list_(pa.decimal128(5, 2)), [[decimal.Decimal("1.50")], None]),
    "ats": (pa.list_(pa.timestamp("us", tz="UTC")), [[dt.datetime(2020, 1, 1, tzinfo=UTC)]]),
    "aby": (pa.list_(pa.binary()), [[b"\x01", None]]),
}


def _rows(count: int) -> list[dict[str, Any]]:
    """Rows as the target holds them (float32 values narrowed)."""
    rows = []
    for i in range(count):
        row: dict[str, Any] = {"id": i}
        for name, (_, values) in COLUMNS.items():
            row[name] = values[i % len(values)]
        rows.append(row)
    schema = pa.schema([("id", pa.int32()), *((n, t) for n, (t, _) in COLUMNS.items())])
    return pa.Table.from_pylist(rows, schema).to_pylist()


def _shape() -> TableShape:
    return TableShape((ComparedColumn("id", pa.int32()),
                       *(ComparedColumn(n, t) for n, (t, _) in COLUMNS.items())), ("id",))


def _write(path: Path, rows: list[dict[str, Any]], **extra: Any) -> None:
    schema = pa.schema([pa.field("id", pa.int32(), nullable=False),
                        *(pa.field(n, t) for n, (t, _) in COLUMNS.items()),
                        *(pa.field(k, pa.bool_() if k == "_deleted" else
                                   pa.timestamp("us", tz="UTC")) for k in extra)])
    table = pa.Table.from_pylist([{**r, **{k: v[i] for k, v in extra.items()}}
                                  for i, r in enumerate(rows)], schema)
    write_deltalake(str(path), table, mode="overwrite")


def test_every_type_agrees_with_the_reference(tmp_path: Path) -> None:
    rows = _rows(60)
    _write(tmp_path / "t", rows)
    shape = _shape()
    with DeltaChecksumSide(str(tmp_path / "t")) as side:
        for buckets in (1, 8, 64):
            assert side.bucket_sums(shape, buckets) == \
                reference_bucket_sums(rows, shape, buckets)
        texts = {key_hash_of(row_texts(r, shape), shape): row_texts(r, shape) for r in rows}
        some = [0, 3]
        fetched = dict(side.bucket_rows(shape, 8, some))
        assert fetched == {k: t for k, t in texts.items() if k % 8 in some}
        excluded = frozenset(list(texts)[:10])
        kept = [r for r in rows if key_hash_of(row_texts(r, shape), shape) not in excluded]
        assert side.bucket_sums(shape, 8, excluded_keys=excluded) == \
            reference_bucket_sums(kept, shape, 8)
        only = side.bucket_sums(shape, 8, only=[1, 2])
        assert only == {b: s for b, s in reference_bucket_sums(rows, shape, 8).items()
                        if b in (1, 2)}


def test_scd2_and_soft_delete_compare_live_rows(tmp_path: Path) -> None:
    rows = _rows(10)
    shape = _shape()
    ended = [None if i % 3 else dt.datetime(2024, 1, 1, tzinfo=UTC) for i in range(10)]
    _write(tmp_path / "scd2", rows, __END_AT=ended)
    live = [r for r, e in zip(rows, ended, strict=True) if e is None]
    with DeltaChecksumSide(str(tmp_path / "scd2"), scd2=True) as side:
        assert side.bucket_sums(shape, 4) == reference_bucket_sums(live, shape, 4)
    deleted = [True if i % 4 == 0 else (None if i % 4 == 1 else False) for i in range(10)]
    _write(tmp_path / "soft", rows, _deleted=deleted)
    live = [r for r, d in zip(rows, deleted, strict=True) if not d]
    with DeltaChecksumSide(str(tmp_path / "soft"), soft_delete_column="_deleted") as side:
        assert side.bucket_sums(shape, 4) == reference_bucket_sums(live, shape, 4)


def test_a_version_is_pinned(tmp_path: Path) -> None:
    rows = _rows(5)
    _write(tmp_path / "t", rows)
    _write(tmp_path / "t", rows[:2])
    shape = _shape()
    with DeltaChecksumSide(str(tmp_path / "t"), version=0) as side:
        assert side.version == 0
        assert side.bucket_sums(shape, 1) == reference_bucket_sums(rows, shape, 1)
    with DeltaChecksumSide(str(tmp_path / "t")) as side:
        assert side.version == 1
        assert side.bucket_sums(shape, 1) == reference_bucket_sums(rows[:2], shape, 1)


def test_a_struct_column_is_refused(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path / "t"), pa.table({"id": [1], "st": [{"a": 1}]}))
    shape = TableShape((ComparedColumn("id", pa.int64()),
                        ComparedColumn("st", pa.struct([("a", pa.int64())]))), ("id",))
    with DeltaChecksumSide(str(tmp_path / "t")) as side, \
            pytest.raises(UnsupportedColumnError, match="struct"):
        side.bucket_sums(shape, 1)


def test_a_large_differing_bucket_is_split_and_its_rows_named(tmp_path: Path) -> None:
    from tidemark.verify.compare import compare_tables  # noqa: PLC0415

    rows = [{"id": i, "v": f"v{i}"} for i in range(10_000)]
    write_deltalake(str(tmp_path / "s"), pa.Table.from_pylist(rows))
    changed = [*rows[:4999], {"id": 4999, "v": "other"}, *rows[5001:],
               {"id": 20_000, "v": "new"}]
    write_deltalake(str(tmp_path / "t"), pa.Table.from_pylist(changed))
    shape = TableShape((ComparedColumn("id", pa.int64()), ComparedColumn("v", pa.string())),
                       ("id",))
    with DeltaChecksumSide(str(tmp_path / "s")) as source, \
            DeltaChecksumSide(str(tmp_path / "t")) as target:
        found = compare_tables(source, target, shape, 1)
        assert found.rows_compared == 10_000
        assert [(d.kind, d.key, d.columns) for d in found.differences] == [
            ("different", {"id": "4999"}, ("v",)), ("extra", {"id": "20000"}, ()),
            ("missing", {"id": "5000"}, ())]
        # The changed keys are left out of the comparison.
        excluded = frozenset(key_hash_of((str(i), f"v{i}"), shape) for i in (4999, 5000))
        assert compare_tables(source, target, shape, 1,
                              excluded_keys=excluded).differences[0].kind == "extra"


def test_doubles_of_every_bit_pattern_have_the_references_bits() -> None:
    rng = random.Random(38)
    values = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
              for _ in range(20_000)]
    values += [1e20, 1e-7, 123.0, 5e-324, 2.2250738585072014e-308, -0.0, 0.0, 1e15,
               1e16, 1e23, 9.999999999999999e22, 0.1, 0.001, -1e-5, float("nan"),
               float("inf"), float("-inf"), 6.9830165215099616e16, 2.0 ** -1022,
               2.0 ** -1074, -(2.0 ** 1023), 2.0 ** 52 - 0.5]
    values += [2.0 ** e for e in range(-1074, 1024)]
    values += [float(rng.randint(-10 ** 17, 10 ** 17)) for _ in range(2000)]
    con = duckdb.connect()
    con.register("v", pa.table({"d": pa.array(values, pa.float64())}))
    texts = con.execute(f"SELECT {text_sql('d', pa.float64())} FROM v").fetchall()
    wrong = [(v, t) for v, (t,) in zip(values, texts, strict=True) if t != float_text(v)]
    assert wrong == []


def test_double_columns_are_read_as_their_bits(tmp_path: Path) -> None:
    """A double column reaches DuckDB as its bits (an int64 view of the buffer): every
    bit pattern, NULLs, a float32 column and a sliced batch keep their texts."""
    rng = random.Random(39)
    doubles = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
               for _ in range(5000)]
    doubles += [float(rng.randint(-10 ** 17, 10 ** 17)) for _ in range(1000)]
    doubles += [None, float("nan"), float("-inf"), -0.0, 5e-324, 6.9830165215099616e16]
    singles = [None if d is None else struct.unpack("<f", struct.pack("<f", rng.random()))[0]
               for d in doubles]
    table = pa.table({"id": pa.array(range(len(doubles)), pa.int64()),
                      "d": pa.array(doubles, pa.float64()),
                      "f": pa.array(singles, pa.float32())})
    write_deltalake(str(tmp_path), table.slice(3))
    shape = TableShape((ComparedColumn("id", pa.int64()), ComparedColumn("d", pa.float64()),
                        ComparedColumn("f", pa.float32())), ("id",))
    rows = table.slice(3).to_pylist()
    with DeltaChecksumSide(str(tmp_path)) as side:
        got = dict(side.bucket_rows(shape, 1, [0]))
        assert got == {key_hash_of(t, shape): t for t in (row_texts(r, shape) for r in rows)}
        assert side.bucket_sums(shape, 16) == reference_bucket_sums(rows, shape, 16)
    sliced = table.to_batches()[0].slice(3)
    read = with_bits([sliced], shape, table.schema, ["id", "d", "f"]).read_all()
    assert read.column(bits_column("d")).to_pylist() == [
        None if d is None else struct.unpack("<q", struct.pack("<d", d))[0]
        for d in doubles[3:]]
