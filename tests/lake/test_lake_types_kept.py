"""A batch that needs the target's rows (a soft delete, an unsent value) reads them back
and writes them again: every type keeps its exact value (both merge modes; merge-on-read
reads the rows by position from the files)."""

from __future__ import annotations

import datetime as dt
import decimal
import math
from pathlib import Path
from typing import Any

import pyarrow as pa

from delta_rows import live_table
from lake_helpers import change
from tidemark.lake import ApplySpec, apply_changes
from tidemark.lake.change_rows import change_rows_schema

TYPES = pa.schema([
    pa.field("id", pa.int64()), pa.field("i8", pa.int8()), pa.field("i16", pa.int16()),
    pa.field("i32", pa.int32()), pa.field("f32", pa.float32()), pa.field("f64", pa.float64()),
    pa.field("dec", pa.decimal128(38, 10)), pa.field("txt", pa.string()),
    pa.field("bin", pa.binary()), pa.field("flag", pa.bool_()), pa.field("day", pa.date32()),
    pa.field("at", pa.timestamp("us", tz="UTC")), pa.field("local", pa.timestamp("us")),
    pa.field("ints", pa.list_(pa.int64())), pa.field("words", pa.list_(pa.string())),
    pa.field("body", pa.string()),
])

_VALUES: list[dict[str, Any]] = [
    {"i8": -128, "i16": 32767, "i32": -2**31, "f32": 1.5, "f64": -0.0,
     "dec": decimal.Decimal("-1234567890123456789012345678.0123456789"), "txt": "ünï 🐘",
     "bin": b"\x00\xff", "flag": True, "day": dt.date(1, 1, 1),
     "at": dt.datetime(1970, 1, 1, tzinfo=dt.UTC), "local": dt.datetime(9999, 12, 31, 23, 59),
     "ints": [1, None, -3], "words": ["a", ""]},
    {"i8": None, "i16": None, "i32": None, "f32": float("nan"), "f64": float("inf"),
     "dec": None, "txt": "", "bin": b"", "flag": None, "day": None, "at": None,
     "local": None, "ints": [], "words": None},
    {"i8": 0, "i16": -1, "i32": 7, "f32": None, "f64": 5e-324,
     "dec": decimal.Decimal("0E-10"), "txt": None, "bin": None, "flag": False,
     "day": dt.date(2026, 11, 28), "at": dt.datetime(2026, 11, 28, 1, 2, 3, 456789, tzinfo=dt.UTC),
     "local": dt.datetime(2026, 1, 1), "ints": None, "words": ["é"]},
]


def _rows(*changes: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(changes), schema=change_rows_schema(TYPES))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) ==
                                                     math.copysign(1, b))
    return bool(a == b)


def _check(path: Path, expected: dict[int, dict[str, Any]]) -> None:
    got = {r["id"]: r for r in live_table(path).to_pylist()}
    assert sorted(got) == sorted(expected)
    for key, row in expected.items():
        for name, value in row.items():
            assert _same(got[key][name], value), (key, name, got[key][name], value)


def test_every_type_keeps_its_value_when_a_batch_reads_the_row_back(tmp_path: Path) -> None:
    spec = ApplySpec(keys=("id",), soft_delete_column="_deleted")
    path = tmp_path / "t"
    first = [change("c", 10, i + 1, id=i + 1, **values, body=f"b{i}")
             for i, values in enumerate(_VALUES)]
    apply_changes(path, _rows(*first), spec, app_id="q", version=0)
    # An update that does not send body (unchanged TOAST) and a soft delete: both write
    # the rows read back from the target.
    second = [change("u", 11, 1, unavailable=("body",), id=1, **_VALUES[0]),
              change("d", 11, 2, id=2)]
    apply_changes(path, _rows(*second), spec, app_id="q", version=1)
    expected = {i + 1: {**values, "body": f"b{i}"} for i, values in enumerate(_VALUES)}
    expected[2]["_deleted"] = True
    expected[1]["_deleted"] = expected[3]["_deleted"] = False
    _check(path, expected)
