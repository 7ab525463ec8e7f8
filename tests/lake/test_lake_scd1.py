"""apply_changes, SCD type 1: upserts, deletes, truncates, ordering, TOAST, idempotence."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Field

from lake_helpers import TABLE, change, read, rows
from tidemark.errors import ConfigError
from tidemark.lake import ApplySpec, apply_changes
from tidemark.lake.delta_target import FILL_KEY
from tidemark.lake.spec import spec_from_mapping

SPEC = ApplySpec(keys=("id",))


def apply(path: Path, batch: pa.Table, version: int, spec: ApplySpec = SPEC, app: str = "q"):
    return apply_changes(path, batch, spec, app_id=app, version=version)


def test_first_batch_creates_the_table_with_not_null_keys(tmp_path: Path) -> None:
    result = apply(tmp_path / "t", rows(change("c", 10, id=1, name="a", body="x"),
                                        change("r", 10, 2, id=2, name="b", body="y")), 0)
    assert (result.inserted, result.updated, result.deleted) == (2, 0, 0)
    assert read(tmp_path / "t", "id", "name", "body") == [
        {"id": 1, "name": "a", "body": "x"}, {"id": 2, "name": "b", "body": "y"}]
    schema = DeltaTable(str(tmp_path / "t")).schema()
    fields = {f.name: f.nullable for f in schema.fields}
    assert fields == {"id": False, "name": True, "body": True, "_commit_lsn": True, "_seq": True}


def test_changes_to_one_key_collapse_to_the_last_by_sequence(tmp_path: Path) -> None:
    # Out of input order on purpose: the sequence decides, not the position.
    batch = rows(change("u", 20, 2, id=1, name="second", body="x"),
                 change("c", 20, 1, id=1, name="first", body="x"),
                 change("c", 21, 1, id=2, name="gone", body="x"),
                 change("d", 21, 2, id=2),
                 change("d", 22, 1, id=3),
                 change("c", 22, 2, id=3, name="back", body="z"))
    result = apply(tmp_path / "t", batch, 0)
    assert (result.inserted, result.superseded, result.skipped) == (2, 3, 0)
    assert read(tmp_path / "t", "id", "name", "_commit_lsn", "_seq") == [
        {"id": 1, "name": "second", "_commit_lsn": 20, "_seq": 2},
        {"id": 3, "name": "back", "_commit_lsn": 22, "_seq": 2}]


def test_updates_deletes_and_a_primary_key_change(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, 1, id=1, name="a", body="x"),
                     change("c", 10, 2, id=2, name="b", body="y")), 0)
    result = apply(path, rows(change("u", 11, 1, id=1, name="A", body="x"),
                              change("d", 12, 1, id=2),
                              change("c", 12, 2, id=20, name="b", body="y")), 1)
    assert (result.inserted, result.updated, result.deleted) == (1, 1, 1)
    assert read(path, "id", "name") == [{"id": 1, "name": "A"}, {"id": 20, "name": "b"}]


def test_truncate_removes_rows_older_than_it_and_keeps_later_changes(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, 1, id=1, name="a"), change("c", 10, 2, id=2, name="b")), 0)
    result = apply(path, rows(change("c", 11, 1, id=3, name="lost"),
                              change("t", 12, 1),
                              change("c", 13, 1, id=4, name="after"),
                              change("u", 13, 2, id=1, name="re-added")), 1)
    assert read(path, "id", "name") == [{"id": 1, "name": "re-added"},
                                        {"id": 4, "name": "after"}]
    assert result.deleted == 1


def test_unchanged_toast_value_keeps_the_targets_value(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, id=1, name="a", body="big"),
                     change("c", 10, 2, id=2, name="b", body="big2")), 0)
    apply(path, rows(change("u", 11, id=1, name="A", unavailable=("body",)),
                     # in-batch: the earlier change of the key knows the value
                     change("u", 12, 1, id=2, name="B", body="new2"),
                     change("u", 12, 2, id=2, name="BB", unavailable=("body",))), 1)
    assert read(path, "id", "name", "body") == [{"id": 1, "name": "A", "body": "big"},
                                                {"id": 2, "name": "BB", "body": "new2"}]


def test_unchanged_toast_value_without_a_target_row_is_null_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, id=1, name="a", body="x")), 0)
    with caplog.at_level(logging.WARNING):
        apply(path, rows(change("u", 11, id=7, name="n", unavailable=("body",))), 1)
        apply(path, rows(change("u", 12, id=8, name="m", unavailable=("body",))), 2)
    assert read(path, "id", "body")[1:] == [{"id": 7, "body": None}, {"id": 8, "body": None}]
    warnings = [r for r in caplog.records if "TOAST" in r.getMessage()]
    assert len(warnings) == 1 and "'body'" in warnings[0].getMessage()


def test_ignore_null_updates_keeps_values(tmp_path: Path) -> None:
    path = tmp_path / "t"
    spec = ApplySpec(keys=("id",), ignore_null_updates=True)
    apply(path, rows(change("c", 10, id=1, name="a", body="x")), 0, spec)
    apply(path, rows(change("u", 11, id=1, name=None, body="y")), 1, spec)
    assert read(path, "id", "name", "body") == [{"id": 1, "name": "a", "body": "y"}]


def test_a_row_made_again_after_its_delete_keeps_nothing_of_the_deleted_row(
        tmp_path: Path) -> None:
    """With ignore_null_updates a null means "unchanged", but not for a row inserted
    after its delete: neither the delete's before-image (same batch) nor the target's
    old row (hard- or soft-deleted there) may fill it."""
    spec = ApplySpec(keys=("id",), ignore_null_updates=True)
    path = tmp_path / "same_batch"
    apply(path, rows(change("c", 10, id=1, name="a", body="x")), 0, spec)
    apply(path, rows(change("d", 11, id=1, name="a", body="x"),
                     change("c", 12, id=1, name=None, body="y")), 1, spec)
    assert read(path, "id", "name", "body") == [{"id": 1, "name": None, "body": "y"}]

    soft = ApplySpec(keys=("id",), ignore_null_updates=True, soft_delete_column="deleted")
    path = tmp_path / "soft"
    apply(path, rows(change("c", 10, id=1, name="a", body="x")), 0, soft)
    apply(path, rows(change("d", 11, id=1)), 1, soft)
    apply(path, rows(change("c", 12, id=1, name=None, body="y")), 2, soft)
    assert read(path, "id", "name", "body", "deleted") == [
        {"id": 1, "name": None, "body": "y", "deleted": False}]


def test_a_new_source_column_is_added_and_old_rows_read_null(tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, id=1, name="a", body="x")), 0)
    wider = pa.schema([*TABLE, pa.field("score", pa.float64())])
    apply(path, rows(change("c", 11, id=2, name="b", body="y", score=1.5), table=wider), 1)
    assert read(path, "id", "score") == [{"id": 1, "score": None}, {"id": 2, "score": 1.5}]


def test_a_replayed_batch_is_not_applied_twice(tmp_path: Path) -> None:
    path = tmp_path / "t"
    first = rows(change("c", 10, id=1, name="a"))
    apply(path, first, 0)
    apply(path, rows(change("d", 11, id=1)), 1)
    version = DeltaTable(str(path)).version()
    again = apply(path, first, 0)
    assert again.already_applied and again.delta_version == version
    assert read(path) == []
    assert DeltaTable(str(path)).transaction_version("q") == 1


def test_an_older_change_under_another_app_id_does_not_resurrect_or_overwrite(
        tmp_path: Path) -> None:
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, id=1, name="a"), change("c", 10, 2, id=2, name="b")), 0)
    apply(path, rows(change("d", 12, id=1), change("u", 12, 2, id=2, name="B")), 1)
    # A re-read from an older position under a new query id: both are stale.
    result = apply(path, rows(change("c", 10, id=1, name="a"),
                              change("c", 10, 2, id=2, name="b"),
                              change("c", 13, id=3, name="new")), 0, app="other")
    assert read(path, "id", "name") == [{"id": 2, "name": "B"}, {"id": 3, "name": "new"}]
    assert result.skipped == 2 and result.inserted == 1


def test_unordered_batches_still_never_overwrite_a_newer_row(tmp_path: Path) -> None:
    path = tmp_path / "t"
    spec = ApplySpec(keys=("id",), ordered_batches=False)
    apply(path, rows(change("c", 20, id=1, name="new")), 0, spec)
    result = apply(path, rows(change("u", 15, id=1, name="old"),
                              change("c", 16, id=2, name="other")), 1, spec)
    assert read(path, "id", "name") == [{"id": 1, "name": "new"}, {"id": 2, "name": "other"}]
    assert (result.updated, result.inserted, result.skipped) == (0, 1, 1)


def test_column_list_and_except_column_list(tmp_path: Path) -> None:
    batch = rows(change("c", 10, id=1, name="a", body="x"))
    apply(tmp_path / "a", batch, 0, ApplySpec(keys=("id",), column_list=("id", "name")))
    apply(tmp_path / "b", batch, 0, ApplySpec(keys=("id",), except_column_list=("name",)))
    assert read(tmp_path / "a") == [{"id": 1, "name": "a", "_commit_lsn": 10, "_seq": 1}]
    assert read(tmp_path / "b") == [{"id": 1, "body": "x", "_commit_lsn": 10, "_seq": 1}]


def test_awkward_column_names_are_quoted(tmp_path: Path) -> None:
    table = pa.schema([pa.field("Order Id", pa.int64()), pa.field("it's \"q\"`s", pa.string()),
                       pa.field("MixedCase", pa.int32())])
    path = tmp_path / "t"
    spec = ApplySpec(keys=("Order Id",))
    apply(path, rows(change("c", 10, **{"Order Id": 1, "it's \"q\"`s": "a", "MixedCase": 1}),
                     table=table), 0, spec)
    apply(path, rows(change("u", 11, **{"Order Id": 1, "it's \"q\"`s": "b", "MixedCase": 2}),
                     change("c", 11, 2, **{"Order Id": 2, "MixedCase": 3}),
                     table=table), 1, spec)
    assert read(path, "Order Id", "it's \"q\"`s", "MixedCase", sort=("Order Id",)) == [
        {"Order Id": 1, "it's \"q\"`s": "b", "MixedCase": 2},
        {"Order Id": 2, "it's \"q\"`s": None, "MixedCase": 3}]


def test_composite_keys(tmp_path: Path) -> None:
    table = pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.string()),
                       pa.field("v", pa.int64())])
    spec = ApplySpec(keys=("a", "b"))
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, a=1, b="x", v=1), change("c", 10, 2, a=1, b="y", v=2),
                     table=table), 0, spec)
    apply(path, rows(change("u", 11, a=1, b="y", v=3), change("d", 11, 2, a=1, b="x"),
                     table=table), 1, spec)
    assert read(path, "a", "b", "v", sort=("a", "b")) == [{"a": 1, "b": "y", "v": 3}]


def test_a_timestamp_sequence_and_a_partitioned_target(tmp_path: Path) -> None:
    path = tmp_path / "t"
    spec = ApplySpec(keys=("id",), sequence_by=("_commit_ts",), partition_by=("name",))
    apply(path, rows(change("c", 10, id=1, name="a"), change("c", 11, id=2, name="b")), 0, spec)
    apply(path, rows(change("u", 12, id=1, name="a", body="x"), change("t", 13),
                     change("c", 14, id=3, name="b")), 1, spec)
    assert read(path, "id", "name", "body") == [{"id": 3, "name": "b", "body": None}]
    assert DeltaTable(str(path)).metadata().partition_columns == ["name"]
    scd2 = ApplySpec(keys=("id",), sequence_by=("_commit_ts",), stored_as_scd_type=2)
    apply(tmp_path / "h", rows(change("c", 10, id=1, name="a"), change("c", 10, 2, id=2)), 0,
          scd2)
    apply(tmp_path / "h", rows(change("u", 11, id=1, name="b"), change("t", 12)), 1, scd2)
    got = read(tmp_path / "h", "id", "__START_AT", "__END_AT", sort=("id", "__START_AT"))
    assert [(r["id"], r["__START_AT"].second, r["__END_AT"].second) for r in got] == [
        (1, 10, 11), (1, 11, 12), (2, 10, 12)]


def test_an_empty_batch_writes_nothing(tmp_path: Path) -> None:
    result = apply(tmp_path / "t", rows(), 0)
    assert result.delta_version is None and not (tmp_path / "t").exists()


def test_spec_from_a_config_mapping() -> None:
    spec = spec_from_mapping({"keys": ["id"], "stored_as_scd_type": 2,
                              "track_history_except_column_list": ["body"]})
    assert spec.keys == ("id",) and spec.track_history_except_column_list == ("body",)
    with pytest.raises(ConfigError, match=r"apply\.keyz: unknown setting; allowed settings "
                                          r"are: column_list"):
        spec_from_mapping({"keyz": ["id"]})


@pytest.mark.parametrize("scd", [1, 2])
def test_a_new_column_s_value_for_existing_rows_is_filled(tmp_path: Path, scd: int) -> None:
    """ADD COLUMN … DEFAULT 'x' gives the source's existing rows 'x' without sending
    them; apply_changes fills what the caller says they hold (SCD2: current versions)."""
    spec = ApplySpec(keys=("id",), stored_as_scd_type=scd)
    apply_changes(tmp_path, rows(change("c", 1, id=1, name="a"), change("c", 1, 2, id=2,
                                                                        name="b"),
                                 change("u", 2, id=1, name="a2")),
                  spec, app_id="q", version=0)
    wider = pa.schema([*TABLE, pa.field("note", pa.string())])
    asked: list[list[str]] = []

    def values(names: Sequence[str]) -> dict[str, object]:
        asked.append(list(names))
        return {"note": "x"}

    apply_changes(tmp_path, rows(change("c", 3, id=3, name="c", note="own"), table=wider),
                  spec, app_id="q", version=1, new_column_values=values)
    assert asked == [["note"]]
    got = read(tmp_path, "id", "name", "note", *(("__END_AT",) if scd == 2 else ()),
               sort=("id", "name"))
    if scd == 2:
        assert [r.pop("__END_AT") is None for r in got] == [False, True, True, True]
    assert [(r["id"], r["name"], r["note"]) for r in got] == \
        [(1, "a", None if scd == 2 else "x"), (1, "a2", "x"), (2, "b", "x"), (3, "c", "own")][
            (0 if scd == 2 else 1):]


def test_a_fill_cut_off_by_a_crash_is_finished_by_the_next_batch(tmp_path: Path) -> None:
    spec = ApplySpec(keys=("id",))
    apply_changes(tmp_path, rows(change("c", 1, id=1, name="a")), spec, app_id="q", version=0)
    # The crash: the column was added (saying what to fill) but the fill never ran.
    table = DeltaTable(str(tmp_path))
    table.alter.add_columns([Field("note", "string", nullable=True)],
                            commit_properties=CommitProperties(
                                custom_metadata={FILL_KEY: json.dumps({"note": "'x'"})}))
    wider = pa.schema([*TABLE, pa.field("note", pa.string())])
    apply_changes(tmp_path, rows(change("c", 2, id=2, name="b", note="own"), table=wider),
                  spec, app_id="q", version=1)
    assert read(tmp_path, "id", "note") == [{"id": 1, "note": "x"}, {"id": 2, "note": "own"}]


def test_soft_deletes_keep_the_row_flagged_with_its_last_values(tmp_path: Path) -> None:
    path = tmp_path / "t"
    spec = ApplySpec(keys=("id",), soft_delete_column="_deleted")
    apply(path, rows(change("c", 10, 1, id=1, name="a", body="x"),
                     change("c", 10, 2, id=2, name="b", body="y"),
                     change("c", 10, 3, id=3, name="c", body="z")), 0, spec)
    # A delete under REPLICA IDENTITY DEFAULT brings only the key.
    result = apply(path, rows(change("d", 11, 1, id=1), change("u", 11, 2, id=2, name="B",
                                                               body="y")), 1, spec)
    assert result.deleted == 0
    assert read(path, "id", "name", "body", "_deleted") == [
        {"id": 1, "name": "a", "body": "x", "_deleted": True},
        {"id": 2, "name": "B", "body": "y", "_deleted": False},
        {"id": 3, "name": "c", "body": "z", "_deleted": False}]
    # An older change replayed out of order does not bring the deleted row back; an
    # insert after the delete does.
    apply(path, rows(change("u", 10, 9, id=1, name="old", body="x")), 2,
          ApplySpec(keys=("id",), soft_delete_column="_deleted", ordered_batches=False))
    assert read(path, "id", "name", "_deleted")[0] == {"id": 1, "name": "a", "_deleted": True}
    apply(path, rows(change("c", 12, 1, id=1, name="again", body="x2")), 3, spec)
    assert read(path, "id", "name", "_deleted")[0] == {"id": 1, "name": "again",
                                                        "_deleted": False}
    # A delete right after an update in one batch keeps the update's values, and a row
    # made and deleted in one batch is kept marked: as if the batch had ended between.
    apply(path, rows(change("u", 12, 2, id=3, name="C", body="z2"), change("d", 12, 3, id=3),
                     change("c", 12, 4, id=5, name="e", body="v"), change("d", 12, 5, id=5)),
          4, spec)
    assert read(path, "id", "name", "body", "_deleted")[2:] == [
        {"id": 3, "name": "C", "body": "z2", "_deleted": True},
        {"id": 5, "name": "e", "body": "v", "_deleted": True}]
    # A truncate marks every row before it; a row written after it stays live.
    apply(path, rows(change("t", 13, 1), change("c", 14, 1, id=4, name="d", body="w")), 5,
          spec)
    assert [(r["id"], r["_deleted"]) for r in read(path, "id", "_deleted")] == [
        (1, True), (2, True), (3, True), (4, False), (5, True)]


def test_a_soft_delete_column_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"soft_delete_column.*stored_as_scd_type=1"):
        ApplySpec(keys=("id",), soft_delete_column="_deleted", stored_as_scd_type=2)
    with pytest.raises(ConfigError, match=r"soft_delete_column.*key or sequence"):
        ApplySpec(keys=("id",), soft_delete_column="id")
    with pytest.raises(ConfigError, match=r"soft_delete_column.*the source does not have"):
        apply(tmp_path / "t", rows(change("c", 10, id=1, name="a")), 0,
              ApplySpec(keys=("id",), soft_delete_column="name"))


def test_an_update_without_a_column_the_target_has_keeps_its_value(tmp_path: Path) -> None:
    """A source column dropped later: the target keeps it, and an update that does not
    carry it keeps the row's value, as a merge's update of the other columns does."""
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, id=1, name="a", body="x"),
                     change("c", 10, 2, id=2, name="b", body="y")), 0)
    narrow = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
    result = apply(path, rows(change("u", 11, id=1, name="A"), change("c", 11, 2, id=3, name="c"),
                              table=narrow), 1)
    assert (result.inserted, result.updated) == (1, 1)
    assert read(path, "id", "name", "body") == [
        {"id": 1, "name": "A", "body": "x"}, {"id": 2, "name": "b", "body": "y"},
        {"id": 3, "name": "c", "body": None}]


@pytest.mark.parametrize("how", ["scd1", "soft", "scd2"])
def test_a_partitioned_target_keeps_its_partition_values_when_rows_are_merged(
        tmp_path: Path, how: str) -> None:
    """Batches that need the target's rows (an unsent value, a soft delete, SCD2
    versions) keep the partition column, which the data files do not hold."""
    spec = {"scd1": ApplySpec(keys=("id",), partition_by=("name",)),
            "soft": ApplySpec(keys=("id",), partition_by=("name",),
                              soft_delete_column="_deleted"),
            "scd2": ApplySpec(keys=("id",), partition_by=("name",), stored_as_scd_type=2)}[how]
    path = tmp_path / "t"
    apply(path, rows(change("c", 10, id=1, name="a", body="x"),
                     change("c", 10, 2, id=2, name="b", body="y")), 0, spec)
    apply(path, rows(change("u", 11, unavailable=("body",), id=1, name="a"),
                     change("d", 12, id=2)), 1, spec)
    got = [(r["id"], r["name"], r["body"]) for r in read(path, "id", "name", "body")]
    assert got == {"scd1": [(1, "a", "x")], "soft": [(1, "a", "x"), (2, "b", "y")],
                   "scd2": [(1, "a", "x"), (2, "b", "y")]}[how]
