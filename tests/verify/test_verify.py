"""tidemark verify end to end: targets written by a real pipeline run, then changed
behind its back, are found equal or named row by row."""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession
from verify_helpers import pipeline_file, run_pipeline

from conftest import Database
from delta_rows import live_table
from tidemark import run_record
from tidemark.cli.main import cli
from tidemark.errors import ConfigError
from tidemark.event import TableId
from tidemark.lake.spec import ApplySpec
from tidemark.source.postgres.kind import KIND
from tidemark.source.verify_snapshot import VerifySnapshot
from tidemark.status.verify_record import read_record, render, summary
from tidemark.verify.report import text_report
from tidemark.verify.result import Difference
from tidemark.verify.run import verify
from tidemark.verify.shape import target_shape

_TARGETS = (
    '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\nexcept_column_list = ["secret"]\n'
    '[targets."public.b"]\npath = "lake/b"\nkeys = ["id"]\nstored_as_scd_type = 2\n'
    '[targets."public.c"]\npath = "lake/c"\nkeys = ["id"]\nsoft_delete_column = "_deleted"\n')


def _setup(db: Database, tmp_path: Path, spark: SparkSession) -> Path:
    db.execute(*(f"CREATE TABLE {t} (id int PRIMARY KEY, v text, n numeric(10,2), "
                 "secret text)" for t in "abc"),
               *(f"INSERT INTO {t} SELECT g, 'v' || g, g / 4.0, 's' FROM "
                 "generate_series(1, 60) g" for t in "abc"))
    file = pipeline_file(tmp_path, db.dsn, db.name, _TARGETS)
    run_pipeline(spark, file)
    # History in b (closed versions), soft-deleted rows in c, a changed secret in a
    db.execute("UPDATE b SET v = v || '+' WHERE id <= 10", "DELETE FROM b WHERE id = 11",
               "DELETE FROM c WHERE id <= 5", "UPDATE c SET n = -n WHERE id = 6",
               "UPDATE a SET secret = 'changed' WHERE id = 1")
    run_pipeline(spark, file)
    return file


@pytest.mark.slow
def test_drift_is_named_and_an_equal_target_passes(
        spark: SparkSession, db: Database, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    file = _setup(db, tmp_path, spark)
    b_rows = live_table(DeltaTable(str(tmp_path / "lake/b")))
    assert b_rows.num_rows > 59, "b holds closed versions"
    assert "secret" not in DeltaTable(str(tmp_path / "lake/a")).schema().to_arrow().names

    # The pipeline is stopped (its run finished): verify does not wait for it to commit
    # the snapshot's position (the default wait is 120 s) but compares at once.
    with caplog.at_level(logging.INFO, logger="tidemark.verify.run"):
        result = verify(file, wait_s=600)
    assert result.error is None
    assert [(t.table, t.equal, t.rows_compared) for t in result.tables] == \
        [("public.a", True, 60), ("public.b", True, 59), ("public.c", True, 55)]
    assert result.exit_code == 0
    assert "the pipeline is not running" in caplog.text
    assert result.seconds < 600, "waited out --wait for a pipeline that is not running"

    # Behind the pipeline's back: a row deleted, one changed, one added; in b the
    # current version of one key changed; in c a soft-deleted row brought back.
    a = DeltaTable(str(tmp_path / "lake/a"))
    a.delete("id = 3")
    a.update({"v": "'zzz'"}, predicate="id = 5")
    schema = pa.schema(a.schema().to_arrow())
    write_deltalake(str(tmp_path / "lake/a"), pa.Table.from_pylist(
        [{"id": 999, "v": "new", "n": None, "_commit_lsn": 0, "_seq": 0}], schema),
        mode="append")
    DeltaTable(str(tmp_path / "lake/b")).update(
        {"n": "n + 1"}, predicate="id = 2 AND __END_AT IS NULL")
    DeltaTable(str(tmp_path / "lake/c")).update({"_deleted": "false"}, predicate="id = 4")

    result = verify(file)
    assert result.exit_code == 1
    found = {t.table: t.differences for t in result.tables}
    assert found["public.a"] == [
        Difference("different", {"id": "5"}, ("v",), True),
        Difference("extra", {"id": "999"}, (), True),
        Difference("missing", {"id": "3"}, (), True)] or \
        [(d.kind, d.key, d.columns) for d in found["public.a"]] == [
        ("different", {"id": "5"}, ("v",)), ("extra", {"id": "999"}, ()),
        ("missing", {"id": "3"}, ())]
    assert [(d.kind, d.key, d.columns) for d in found["public.b"]] == \
        [("different", {"id": "2"}, ("n",))]
    assert [(d.kind, d.key) for d in found["public.c"]] == [("extra", {"id": "4"})]
    lines = text_report(result)
    assert any("different id=5 (v)" in line for line in lines), lines
    assert any("missing id=3" in line for line in lines), lines
    assert any("extra id=999" in line for line in lines), lines

    record = read_record(tmp_path / "chk")
    assert record is not None and record["result"] == "different"
    assert summary(record)["tables"]["public.a"] == {"rows_compared": 60,
                                                     "rows_different": 3}
    assert "public.a: 3 of 60 rows differ" in render(summary(record))[0]

    # The command: --table, --json, exit 1
    out = CliRunner().invoke(cli, ["verify", str(file), "--table", "public.b", "--json"],
                             standalone_mode=False)
    assert isinstance(out.exception, SystemExit) and out.exception.code == 1, out.output
    report = json.loads(out.stdout)
    assert [t["table"] for t in report["tables"]] == ["public.b"]
    assert report["tables"][0]["differences"][0]["columns"] == ["n"]
    out = CliRunner().invoke(cli, ["verify", str(file), "--table", "public.x"],
                             standalone_mode=False)
    assert isinstance(out.exception, SystemExit) and out.exception.code == 2
    assert "public.x is not a target" in out.output

    # Changes the stopped pipeline has not applied: reported, marked target behind.
    db.execute("UPDATE c SET v = 'late' WHERE id = 20",
               "INSERT INTO c VALUES (700, 'new', 1, 's')")
    out = CliRunner().invoke(cli, ["verify", str(file), "--table", "public.c"],
                             standalone_mode=False)
    assert isinstance(out.exception, SystemExit) and out.exception.code == 1, out.output
    assert "different id=20 (v) [target behind]" in out.output
    assert "missing id=700 [target behind]" in out.output
    assert "the pipeline had not caught up with the source (target behind)" in out.output

    # A pipeline that runs (its record says so, its process is alive) but has not
    # committed the position in --wait: the rows may be in flight, so this is no
    # difference to report or repair, but an error naming the lag.
    record_file = tmp_path / "chk" / run_record.FILE_NAME
    saved = record_file.read_bytes()
    record_file.write_bytes(msgspec.json.encode(run_record.RunRecord(
        outcome="running", host=socket.gethostname(), pid=os.getpid())))
    try:
        out = CliRunner().invoke(cli, ["verify", str(file), "--table", "public.c",
                                       "--wait", "2"], standalone_mode=False)
    finally:
        record_file.write_bytes(saved)
    assert isinstance(out.exception, SystemExit) and out.exception.code == 2, out.output
    assert "did not commit the source's position in 2 s" in out.output, out.output
    assert "different id=20 (v) [target behind]" in out.output


def test_a_struct_column_is_refused_naming_it() -> None:
    schema = pa.schema([("id", pa.int32()), ("st", pa.struct([("a", pa.int64())]))])
    with pytest.raises(ConfigError, match=r"column 'st' of type struct<a: int64> cannot be "
                                          r"verified"):
        target_shape("public.t", schema, ApplySpec(keys=("id",)))


def test_shape_leaves_out_history_soft_delete_and_sequence_columns() -> None:
    schema = pa.schema([("id", pa.int32()), ("v", pa.string()), ("_commit_lsn", pa.int64()),
                        ("_seq", pa.int64()), ("__START_AT", pa.int64()),
                        ("__END_AT", pa.int64()), ("_deleted", pa.bool_())])
    shape = target_shape("public.t", schema, ApplySpec(keys=("id",),
                                                       soft_delete_column="_deleted"))
    assert [c.name for c in shape.columns] == ["id", "v"]


def test_a_truncate_after_the_snapshot_is_compared_at_a_later_one(
        db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g")
    db.autocommit(f"CREATE PUBLICATION p_{db.name} FOR TABLE t")
    file = pipeline_file(tmp_path, db.dsn, db.name,
                         '[targets."public.t"]\npath = "lake/t"\nkeys = ["id"]\n')
    # The target as a pipeline that has not run since would hold it.
    write_deltalake(str(tmp_path / "lake/t"), pa.table(
        {"id": pa.array(range(1, 21), pa.int32()), "v": [f"v{i}" for i in range(1, 21)],
         "_commit_lsn": pa.array([0] * 20, pa.int64()),
         "_seq": pa.array([0] * 20, pa.int64())}))
    opened: list[VerifySnapshot] = []

    def truncated_after(tables: Sequence[TableId]) -> VerifySnapshot:
        snapshot = KIND.verify_snapshot(db.dsn, tables, publication=f"p_{db.name}")
        if not opened:  # the first snapshot's changes after it: a truncate
            db.execute("TRUNCATE t", "INSERT INTO t VALUES (100, 'after')")
        opened.append(snapshot)
        return snapshot

    result = verify(file, open_snapshot=truncated_after)
    assert result.error is None, result.error
    (table,) = result.tables
    # The first round could not list the changed keys; the second compared the table
    # after the truncate (the pipeline has not applied it: target behind).
    assert [(r.number, r.keys_changed, r.rows_compared) for r in table.round_results] == \
        [(1, -1, 0), (2, 0, 1)]
    assert [(d.kind, d.key["id"], d.target_behind) for d in table.differences] == \
        [*(("extra", str(i), True) for i in sorted(range(1, 21), key=str)),
         ("missing", "100", True)]
