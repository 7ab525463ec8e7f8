"""Which repair keys a source that would not refuse them itself (MariaDB, SQLite) lets
through when the signal is taken: values of the key column's logical type, as
``tidemark verify`` sends them (:func:`tidemark.source.repair_keys.key_value`), and not
a number of another kind, a text that is no number, or one out of the column's range."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tidemark.logical_type import Kind, LogicalType
from tidemark.source.repair import RepairRequest
from tidemark.source.repair_keys import key_type_problem, key_value
from tidemark.source.repair_signal import KeyValue


def _problem(kind: Kind, value: KeyValue) -> str | None:
    request = RepairRequest("s1", "db.t", ("k",), ((value,),))
    return key_type_problem(request, {"k": LogicalType(kind)})


@pytest.mark.parametrize(("kind", "value"), [
    (Kind.INT32, 5), (Kind.INT32, "5"), (Kind.INT32, -(1 << 31)), (Kind.INT64, 1 << 62),
    (Kind.INT16, (1 << 15) - 1), (Kind.BOOL, True), (Kind.BOOL, "f"), (Kind.BOOL, "true"),
    (Kind.DECIMAL, "1.50"), (Kind.FLOAT64, 1.5), (Kind.STRING, "anything"),
    (Kind.DATE, "2024-03-04"), (Kind.TIMESTAMPTZ, "2024-03-04 05:06:01.5+00"),
    (Kind.TIMESTAMP, "2024-03-04 05:06:01.5"),
])
def test_values_of_the_column_pass(kind: Kind, value: KeyValue) -> None:
    assert _problem(kind, value) is None


@pytest.mark.parametrize(("kind", "value"), [
    (Kind.INT32, 1.5), (Kind.INT32, 1.0), (Kind.INT32, "abc"), (Kind.INT32, True),
    (Kind.INT32, 1 << 31), (Kind.INT16, 1 << 15), (Kind.INT64, 1 << 63),
    (Kind.BOOL, "yes"), (Kind.BOOL, 1), (Kind.DECIMAL, "x"), (Kind.DATE, "not a date"),
])
def test_other_values_are_named(kind: Kind, value: KeyValue) -> None:
    problem = _problem(kind, value)
    assert problem is not None and f"is not a value of k ({kind})" in problem


@pytest.mark.parametrize(("text", "target"), [
    ("t", pa.bool_()), ("f", pa.bool_()), ("42", pa.int32()), ("-7", pa.int64()),
    ("2.50", pa.decimal128(10, 2)), ("19786", pa.date32()),
])
def test_what_verify_sends_passes(text: str, target: pa.DataType) -> None:
    kind = {pa.bool_(): Kind.BOOL, pa.int32(): Kind.INT32, pa.int64(): Kind.INT64,
            pa.date32(): Kind.DATE}.get(target, Kind.DECIMAL)
    assert _problem(kind, key_value(text, target)) is None
