"""apply_changes and ApplySpec: bad settings and bad input are named with what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lake_helpers import change, rows
from tidemark.errors import ConfigError, TidemarkError
from tidemark.lake import ApplySpec, apply_changes
from tidemark.lake.sql import quote


@pytest.mark.parametrize(("settings", "key", "words"), [
    ({"keys": ()}, "keys", "at least one"),
    ({"keys": "id"}, "keys", "list of column names"),
    ({"keys": ("id", "id")}, "keys", "more than once"),
    ({"keys": ("id",), "stored_as_scd_type": 3}, "stored_as_scd_type", "1 or 2"),
    ({"keys": ("id",), "column_list": ("id",), "except_column_list": ("x",)}, "column_list",
     "not both"),
    ({"keys": ("id",), "track_history_column_list": ("name",)}, "track_history_column_list",
     "stored_as_scd_type=2"),
    ({"keys": ("id",), "sequence_by": ()}, "sequence_by", "at least one"),
    ({"keys": ("id",), "sequence_by": ("id",)}, "sequence_by", "key column"),
    ({"keys": ("id",), "apply_as_deletes": "_op = 'd'"}, "apply_as_deletes", "expression"),
    ({"keys": ("a\nb",)}, "keys", "control character"),
    ({"keys": ("id",), "ordered_batches": "yes"}, "ordered_batches", "true or false"),
])
def test_bad_spec_values_are_named(settings: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        ApplySpec(**settings)
    assert err.value.key == key and words in str(err.value)


@pytest.mark.parametrize(("spec", "key", "words"), [
    (ApplySpec(keys=("nope",)), "keys", "'nope' is not in the change rows"),
    (ApplySpec(keys=("id",), sequence_by=("_commit_lsn", "ts")), "sequence_by", "'ts'"),
    (ApplySpec(keys=("id",), column_list=("id", "nmae")), "column_list", "'nmae'"),
    (ApplySpec(keys=("id",), column_list=("name",)), "column_list", "key column"),
    (ApplySpec(keys=("id",), except_column_list=("id",)), "except_column_list", "key column"),
    (ApplySpec(keys=("id",), partition_by=("_op",)), "partition_by", "not a target column"),
])
def test_spec_checked_against_the_change_rows(tmp_path: Path, spec: ApplySpec, key: str,
                                              words: str) -> None:
    with pytest.raises(ConfigError) as err:
        apply_changes(tmp_path / "t", rows(change("c", 1, id=1)), spec, app_id="a", version=0)
    assert err.value.key == key and words in str(err.value)
    assert "id, name, body, _op" in str(err.value) or key in ("column_list",
                                                                "except_column_list",
                                                                "partition_by")


def test_null_key_and_null_sequence_are_errors(tmp_path: Path) -> None:
    spec = ApplySpec(keys=("id",))
    with pytest.raises(TidemarkError, match="key column 'id' is null"):
        apply_changes(tmp_path / "t", rows(change("u", 1, name="x")), spec, app_id="a",
                      version=0)
    good = rows(change("c", 1, id=1))
    bad = good.set_column(good.schema.get_field_index("_seq"), "_seq",
                          pa.array([None], pa.int64()))
    with pytest.raises(TidemarkError, match="sequence column '_seq' holds nulls"):
        apply_changes(tmp_path / "t", bad, spec, app_id="a", version=0)


@pytest.mark.parametrize("kind", ["directory of other files", "file"])
def test_target_that_is_not_a_delta_table(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "t"
    if kind == "file":
        target.write_text("x\n")  # delta-rs alone says "Path does not exist" here
    else:
        target.mkdir()
        (target / "data.csv").write_text("x\n")
    with pytest.raises(ConfigError) as err:
        apply_changes(target, rows(change("c", 1, id=1)), ApplySpec(keys=("id",)),
                      app_id="a", version=0)
    assert f"{target} " in str(err.value) and "not a Delta table" in str(err.value)
    assert "expected a Delta table's directory, or a new or empty directory" in str(err.value)
    assert target.is_file() if kind == "file" else sorted(target.iterdir()) == [
        target / "data.csv"]


@pytest.mark.parametrize("where", ["under a file", "unknown scheme"])
def test_a_target_delta_rs_cannot_create_is_one_line_naming_the_path(
        tmp_path: Path, where: str) -> None:
    (tmp_path / "afile").write_text("x\n")
    target = str(tmp_path / "afile" / "t") if where == "under a file" else "nosuch://b/t"
    with pytest.raises(ConfigError) as err:
        apply_changes(target, rows(change("c", 1, id=1)), ApplySpec(keys=("id",)),
                      app_id="a", version=0)
    message = str(err.value)
    assert err.value.key == "target"
    assert f"cannot create the Delta table at {target}: " in message or \
        f"cannot open the Delta table at {target}: " in message
    assert "\n" not in message and "Os {" not in message
    assert ("Not a directory" if where == "under a file" else "Unknown scheme: nosuch") \
        in message


def test_an_empty_directory_becomes_the_table(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    result = apply_changes(tmp_path / "t", rows(change("c", 1, id=1)),
                           ApplySpec(keys=("id",)), app_id="a", version=0)
    assert result.inserted == 1


def test_reserved_column_names_are_rejected(tmp_path: Path) -> None:
    table = pa.schema([pa.field("id", pa.int64()), pa.field("__tm_x", pa.int64())])
    with pytest.raises(ConfigError, match="reserved"):
        apply_changes(tmp_path / "t", rows(change("c", 1, id=1), table=table),
                      ApplySpec(keys=("id",)), app_id="a", version=0)


def test_duplicate_columns_are_rejected(tmp_path: Path) -> None:
    batch = rows(change("c", 1, id=1))
    batch = batch.append_column("name", pa.array(["x"]))
    with pytest.raises(ConfigError, match="'name' appears more than once"):
        apply_changes(tmp_path / "t", batch, ApplySpec(keys=("id",)), app_id="a", version=0)


def test_a_delete_expression_over_a_missing_column(tmp_path: Path) -> None:
    batch = rows(change("c", 1, id=1)).drop_columns(["_op"])
    with pytest.raises(ConfigError) as err:
        apply_changes(tmp_path / "t", batch, ApplySpec(keys=("id",)), app_id="a", version=0)
    assert err.value.key == "apply_as_truncates" and "_op" in str(err.value)


def test_quote_doubles_backticks() -> None:
    assert quote("a`b c") == "`a``b c`"
