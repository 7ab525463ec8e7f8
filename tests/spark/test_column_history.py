"""Which column of today an older layout's column is (no database: the matching)."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import IntegerType, StructField, StructType

from tidemark.spark.column_history import (
    DROPPED,
    TableLayout,
    Unmatched,
    arrow_without_layout,
    match,
    with_layout,
    without_layout,
)

INT, TEXT = 23, 25


def _layout(*attrs: tuple[str, int] | None) -> TableLayout:
    return TableLayout(relid=7, read_at=100, attrs=attrs)


def test_a_rename_is_found_by_attribute_number() -> None:
    layout = _layout(("id", INT), ("v", INT), ("c1r", INT))
    assert match(layout, 7, ["id", "v", "c1"], [INT, INT, INT]) == ("id", "v", "c1r")
    assert match(layout, 7, ["id", "v"], [INT, INT]) == ("id", "v")


def test_a_column_dropped_since_is_told_apart_when_only_one_layout_fits() -> None:
    layout = _layout(("id", INT), ("v", INT), ("c1r", INT), None)
    assert match(layout, 7, ["id", "v", "c1", "x"], [INT] * 4) == ("id", "v", "c1r", DROPPED)
    assert match(layout, 7, ["id", "v", "c1"], [INT] * 3) == ("id", "v", "c1r")


def test_a_drop_before_the_columns_matched_makes_names_the_only_guide() -> None:
    layout = _layout(("id", INT), ("v", INT), None, ("c2", INT))
    # c1 dropped and c2 added, or c1 (the 4th) renamed to c2 after the 3rd was dropped.
    assert isinstance(match(layout, 7, ["id", "v", "c1"], [INT] * 3), Unmatched)
    # Every name still there, in order: the usual case after an old DROP COLUMN.
    assert match(layout, 7, ["id", "v", "c2"], [INT] * 3) == ("id", "v", "c2")


def test_what_cannot_be_proven_is_refused() -> None:
    layout = _layout(("id", INT), ("v", INT), ("c1r", INT), ("c1", INT))
    # c1 renamed to c1r and a new c1 added: names and numbers disagree.
    assert isinstance(match(layout, 7, ["id", "v", "c1"], [INT] * 3), Unmatched)
    # A rename whose type changed too, a table made again, more columns than there are.
    assert isinstance(match(layout, 7, ["id", "v", "old"], [INT, INT, TEXT]), Unmatched)
    assert isinstance(match(layout, 8, ["id", "v", "old"], [INT] * 3), Unmatched)
    assert isinstance(match(layout, 7, ["id", "v", "a", "b", "c"], [INT] * 5), Unmatched)
    # No column numbers (MariaDB).
    assert isinstance(match(TableLayout(0, 100, None), 1, ["id", "x"], [0, 0]), Unmatched)


def test_the_layout_never_reaches_a_target_s_schema() -> None:
    """It changes at every query start: in a Delta target's schema it would make the
    next query's writes fail (delta-rs refuses to merge differing field metadata)."""
    plain = StructType([StructField("id", IntegerType(), True, {"tidemark.key": True}),
                        StructField("v", IntegerType())])
    laid = with_layout(plain, _layout(("id", INT), ("v", INT)))
    assert laid != plain and without_layout(laid) == plain
    table = pa.table({"id": [1], "v": [2]}).cast(to_arrow_schema(laid))
    stripped = arrow_without_layout(table)
    assert stripped.schema == to_arrow_schema(plain)
    assert stripped.schema[0].metadata == to_arrow_schema(plain)[0].metadata
    assert stripped.to_pylist() == [{"id": 1, "v": 2}]
