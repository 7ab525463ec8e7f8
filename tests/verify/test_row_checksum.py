"""The checksum rules' reference implementation (tidemark.row_checksum), which every
dialect is tested against."""

from __future__ import annotations

import datetime as dt
import decimal
import struct

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.row_checksum import (
    ComparedColumn,
    TableShape,
    UnsupportedColumnError,
    float_text,
    reference_bucket_sums,
    row_text,
    text_hash,
    value_text,
)


@pytest.mark.parametrize(("value", "text"), [
    (1.5, "0.15e1"), (100.0, "0.1e3"), (0.001, "0.1e-2"), (1e20, "0.1e21"),
    (-2.25, "-0.225e1"), (0.0, "0"), (-0.0, "0"), (float("nan"), "nan"),
    (float("inf"), "inf"), (float("-inf"), "-inf"), (5e-324, "0.5e-323"),
])
def test_float_texts(value: float, text: str) -> None:
    assert float_text(value) == text


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_float_text_reads_back_as_the_same_double(value: float) -> None:
    text = float_text(value)
    if text == "0":
        assert value == 0
        return
    sign, _, rest = text.rpartition("0.")
    digits, _, exponent = rest.partition("e")
    assert float(f"{sign}0.{digits}e{exponent}") == value
    assert not digits.endswith("0")


def test_float32_is_widened() -> None:
    single = struct.unpack("f", struct.pack("f", 0.1))[0]
    assert value_text(single, pa.float32()) == "0.10000000149011612e0"


@pytest.mark.parametrize(("value", "target", "text"), [
    (decimal.Decimal("1.5"), pa.decimal128(10, 2), "1.50"),
    (decimal.Decimal("-0.00"), pa.decimal128(10, 2), "0.00"),
    (decimal.Decimal("12"), pa.decimal128(10, 0), "12"),
    (decimal.Decimal("123456789012345678901234567890"), pa.decimal128(30, 0),
     "123456789012345678901234567890"),
    (decimal.Decimal("-1234567890123456789012345678.9"), pa.decimal128(38, 9),
     "-1234567890123456789012345678.900000000"),
    (True, pa.bool_(), "t"),
    (-7, pa.int64(), "-7"),
    (b"\x00\xff", pa.binary(), "00ff"),
    (dt.date(1969, 12, 31), pa.date32(), "-1"),
    (dt.datetime(1970, 1, 1, 0, 0, 1, 5), pa.timestamp("us"), "1000005"),
    (dt.datetime(1970, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))),
     pa.timestamp("us", tz="UTC"), "0"),
    (dt.time(0, 0, 1, 2), pa.time64("us"), "1000002"),
    ([1, None, 3], pa.list_(pa.int32()), "[1:1~1:3]"),
    ("héllo", pa.string(), "héllo"),
])
def test_value_texts(value: object, target: pa.DataType, text: str) -> None:
    assert value_text(value, target) == text


def test_fields_keep_neighbouring_texts_apart() -> None:
    assert row_text(["a", "bc"]) != row_text(["ab", "c"])
    assert row_text([None]) != row_text([""])
    assert text_hash(row_text(["a"])) < 2 ** 60


def test_a_struct_has_no_canonical_text() -> None:
    with pytest.raises(UnsupportedColumnError):
        value_text({"a": 1}, pa.struct([("a", pa.int32())]))


def test_buckets_refine_by_key_hash() -> None:
    shape = TableShape((ComparedColumn("id", pa.int64()), ComparedColumn("v", pa.string())),
                       ("id",))
    rows = [{"id": i, "v": str(i)} for i in range(200)]
    coarse = reference_bucket_sums(rows, shape, 4)
    fine = reference_bucket_sums(rows, shape, 16)
    assert sum(b.rows for b in coarse.values()) == 200
    for bucket, total in coarse.items():
        parts = [fine[b] for b in (bucket, bucket + 4, bucket + 8, bucket + 12) if b in fine]
        assert sum(p.rows for p in parts) == total.rows
        assert sum(p.total for p in parts) == total.total
