"""apply_changes after a source column's type changed: widened in the target where
Delta's type widening allows, one clear error where it does not."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from delta_rows import live_table
from lake_helpers import change, read, rows
from tidemark.lake import ApplySpec, apply_changes
from tidemark.lake.widening import TypeChangeError, widens

SCD1 = ApplySpec(keys=("id",))
SCD2 = ApplySpec(keys=("id",), stored_as_scd_type=2)


def _table(v: pa.DataType, n: pa.DataType) -> pa.Schema:
    return pa.schema([pa.field("id", pa.int32()), pa.field("v", v), pa.field("n", n)])


def _types(path: Path) -> dict[str, str]:
    return {f.name: str(f.type.type) for f in DeltaTable(str(path)).schema().fields
            if f.name in ("id", "v", "n")}


@pytest.mark.parametrize("spec", [SCD1, SCD2], ids=["scd1", "scd2"])
def test_a_widened_source_type_widens_the_target_and_keeps_its_rows(
        spec: ApplySpec, tmp_path: Path) -> None:
    path = tmp_path / "t"
    before = _table(pa.int32(), pa.decimal128(5, 2))
    apply_changes(path, rows(change("c", 10, 1, id=1, v=1, n=Decimal("1.50")),
                             change("c", 10, 2, id=2, v=2, n=Decimal("2.50")), table=before),
                  spec, app_id="q", version=0)
    # ALTER COLUMN v TYPE bigint, ALTER COLUMN n TYPE numeric(12, 3), id TYPE bigint.
    after = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.int64()),
                       pa.field("n", pa.decimal128(12, 3))])
    apply_changes(path, rows(change("u", 11, 1, id=1, v=5_000_000_000,
                                    n=Decimal("123456789.125")), table=after),
                  spec, app_id="q", version=1)
    assert _types(path) == {"id": "long", "v": "long", "n": "decimal(12,3)"}
    current = [r for r in read(path, "id", "v", "n", *(("__END_AT",) if spec is SCD2 else ()))
               if r.get("__END_AT") is None]
    assert [(r["id"], r["v"], r["n"]) for r in current] == [
        (1, 5_000_000_000, Decimal("123456789.125")), (2, 2, Decimal("2.500"))]
    table = DeltaTable(str(path))
    assert table.transaction_version("q") == 1
    # A replay of the batch finds it applied; the older version still reads as it was.
    result = apply_changes(path, rows(change("u", 11, 1, id=1, v=5_000_000_000,
                                             n=Decimal("123456789.125")), table=after),
                           spec, app_id="q", version=1)
    assert result.already_applied
    old = live_table(DeltaTable(str(path), version=0))
    assert old.schema.field("v").type == pa.int32()


def test_a_narrower_source_type_is_applied_into_the_wider_target(tmp_path: Path) -> None:
    path = tmp_path / "t"
    wide = _table(pa.int64(), pa.decimal128(12, 3))
    apply_changes(path, rows(change("c", 10, 1, id=1, v=5_000_000_000, n=Decimal("1.5")),
                             table=wide), SCD1, app_id="q", version=0)
    narrow = _table(pa.int32(), pa.decimal128(5, 2))
    apply_changes(path, rows(change("u", 11, 1, id=1, v=7, n=Decimal("2.25")), table=narrow),
                  SCD1, app_id="q", version=1)
    assert _types(path) == {"id": "integer", "v": "long", "n": "decimal(12,3)"}
    assert read(path, "id", "v") == [{"id": 1, "v": 7}]


def test_a_type_change_delta_cannot_follow_stops_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply_changes(path, rows(change("c", 10, 1, id=1, v=1, n=Decimal("1.5")),
                             table=_table(pa.int32(), pa.decimal128(5, 2))),
                  SCD1, app_id="q", version=0)
    version = DeltaTable(str(path)).version()
    text = _table(pa.string(), pa.decimal128(5, 2))  # ALTER COLUMN v TYPE text
    with pytest.raises(TypeChangeError) as caught:
        apply_changes(path, rows(change("u", 11, 1, id=1, v="one", n=Decimal("1.5")),
                                 table=text), SCD1, app_id="q", version=1)
    message = str(caught.value)
    assert "\n" not in message
    assert "'v'" in message and str(path) in message
    assert "integer in Delta but string in the source" in message
    assert "reload" in message
    assert DeltaTable(str(path)).version() == version
    assert read(path, "id", "v") == [{"id": 1, "v": 1}]


@pytest.mark.parametrize(("old", "new", "allowed"), [
    ("short", "long", True), ("long", "integer", False), ("float", "double", True),
    ("integer", "double", True), ("long", "double", False),
    ("decimal(5,2)", "decimal(10,2)", True), ("decimal(5,2)", "decimal(6,3)", True),
    ("decimal(5,2)", "decimal(5,3)", False), ("decimal(10,2)", "decimal(10,1)", False),
    ("integer", "decimal(10,0)", True), ("integer", "decimal(10,1)", False),
    ("date", "timestamp_ntz", True), ("date", "timestamp", False),
    ("integer", "string", False), ("string", "binary", False)])
def test_widening_follows_deltas_type_widening_rules(old: str, new: str,
                                                     allowed: bool) -> None:
    assert widens(old, new) is allowed
