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
    key_hash,
    reference_bucket_sums,
    row_text,
    text_hash,
    value_text,
)


@pytest.mark.parametrize(("value", "text"), [
    (1.5, "3ff8000000000000"), (0.0, "0000000000000000"), (-0.0, "8000000000000000"),
    (float("nan"), "NaN"), (float("inf"), "7ff0000000000000"),
    (float("-inf"), "fff0000000000000"), (5e-324, "0000000000000001"),
    # PostgreSQL prints 6.9830165215099616e+16, Python and DuckDB 6.983016521509962e+16:
    # the bits are the same.
    (6.9830165215099616e16, "436f02c54a08175c"),
])
def test_float_texts(value: float, text: str) -> None:
    assert float_text(value) == text


@given(st.floats(allow_nan=False))
def test_a_float_text_is_the_doubles_bits(value: float) -> None:
    assert struct.unpack(">d", bytes.fromhex(float_text(value)))[0] == value


def test_float32_is_widened() -> None:
    single = struct.unpack("f", struct.pack("f", 0.1))[0]
    assert value_text(single, pa.float32()) == "3fb99999a0000000"


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
    ([1, None, 3], pa.list_(pa.int32()), "[1,~3,]"),
    (["a", None, ""], pa.list_(pa.string()), "[1:a~0:]"),
    ("héllo", pa.string(), "héllo"),
])
def test_value_texts(value: object, target: pa.DataType, text: str) -> None:
    assert value_text(value, target) == text


def test_fields_keep_neighbouring_texts_apart() -> None:
    two_strings = (pa.string(), pa.string())
    assert row_text(["a", "bc"], two_strings) != row_text(["ab", "c"], two_strings)
    assert row_text([None], [pa.string()]) != row_text([""], [pa.string()])
    two_ints = (pa.int64(), pa.int64())
    assert row_text(["1", "23"], two_ints) != row_text(["12", "3"], two_ints)
    assert row_text([None, "1"], two_ints) != row_text(["1", None], two_ints)
    lists = (pa.list_(pa.int64()), pa.list_(pa.int64()))
    assert row_text(["[1,]", "[]"], lists) != row_text(["[]", "[1,]"], lists)
    assert text_hash(row_text(["a"], [pa.string()])) < 2 ** 60


@pytest.mark.parametrize(("key", "expected"), [
    (0, 0), (7, 7), (2 ** 60 - 1, 2 ** 60 - 1),
])
def test_an_integer_key_below_2_60_is_its_own_hash(key: int, expected: int) -> None:
    shape = TableShape((ComparedColumn("id", pa.int64()),), ("id",))
    assert key_hash([str(key)], shape) == expected


@pytest.mark.parametrize("key", [-1, 2 ** 60, 2 ** 63 - 1, None])
def test_other_integer_keys_are_hashed(key: int | None) -> None:
    shape = TableShape((ComparedColumn("id", pa.int64()),), ("id",))
    text = None if key is None else str(key)
    assert key_hash([text], shape) == text_hash(row_text([text], [pa.int64()]))
    assert 0 <= key_hash([text], shape) < 2 ** 60


def test_a_key_of_two_integers_or_of_a_string_is_hashed() -> None:
    pair = TableShape((ComparedColumn("a", pa.int64()), ComparedColumn("b", pa.int64())),
                      ("a", "b"))
    assert key_hash(["1", "2"], pair) == text_hash("1,2,")
    text = TableShape((ComparedColumn("k", pa.string()),), ("k",))
    assert key_hash(["7"], text) == text_hash("1:7")


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
