"""Snapshots in ``tidemark run`` and the Spark source: a database that already holds data
ends up equal in Delta, with writers running during the snapshot, with targets added
later, and across a SIGKILL in the middle of a snapshot (MISSION S5, C3)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

import tidemark.spark as ts
from conftest import Database
from delta_rows import live_table
from pipeline_helpers import _batch_lines, _LivePipeline, _tidemark_run
from pipeline_helpers import _Writer as _PipelineWriter
from tidemark.errors import SourceError
from tidemark.event import TableId
from tidemark.pipeline import load_config
from tidemark.pipeline.compare import compare
from tidemark.pipeline.progress import BatchReport
from tidemark.pipeline.query_errors import source_unavailable
from tidemark.pipeline.runner import Pipeline
from tidemark.source.postgres import wal_reads as wal
from tidemark.source.postgres.chunked_snapshot import copy_out, next_boundary, parse_csv
from tidemark.source.postgres.stream_signals import check_signal_table, snapshot_requests
from tidemark.source.signals import send_signal, signal_table_ddl
from tidemark.spark.arrow_rows import EnvelopeSink
from tidemark.spark.change_schemas import envelope_table_schemas, typed_rows
from waiting import wait_for

pytestmark = pytest.mark.integration

ROWS = 3000


def _populate(db: Database) -> None:
    """a (SCD1), b (SCD2) and c (composite key with text, SCD1), ROWS rows each."""
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))",
               "CREATE TABLE b (id int PRIMARY KEY, v text)",
               "CREATE TABLE c (k1 int, k2 text, v text, PRIMARY KEY (k1, k2))",
               f"INSERT INTO a SELECT g, 'a' || g, g / 4.0 FROM generate_series(1, {ROWS}) g",
               f"INSERT INTO b SELECT g, 'b' || g FROM generate_series(1, {ROWS}) g",
               f"INSERT INTO c SELECT g % 7, 'k,\"' || g, E'line\\n' || g "
               f"FROM generate_series(1, {ROWS}) g",
               "ANALYZE a, b, c")


def _pipeline(tmp_path: Path, db: Database, *targets: str, extra: str = "",
              source: str = "") -> Path:
    sections = {
        "a": '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\n',
        "b": '[targets."public.b"]\npath = "lake/b"\nkeys = ["id"]\nstored_as_scd_type = 2\n',
        "c": '[targets."public.c"]\npath = "lake/c"\nkeys = ["k1", "k2"]\n',
    }
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[source]\ndsn = "{db.dsn}"\nslot = "s_{db.name}"\npublication = "p_{db.name}"\n'
        f"snapshotChunkRows = 700\nsnapshotChunksPerTrigger = 3\n{source}"
        f'[spark]\ncheckpoint = "chk"\navailable_now = true\n{extra}\n'
        + "\n".join(sections[t] for t in targets))
    return file


class _Writer(_PipelineWriter):
    """Random small transactions over the whole key range of a, b and c (inserts,
    updates, deletes, primary key changes) until :meth:`finish`."""

    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(dsn, seed, limit=None, changes=5, pause_s=0.002)

    def _change(self, cur: Any, rng: random.Random) -> None:
        key = rng.randint(1, ROWS + 200)
        table = rng.choice("abc")
        op = rng.random()
        if table == "c":
            k1, k2 = key % 7, f'k,"{key}'
            if op < 0.5:
                cur.execute("INSERT INTO c VALUES (%s, %s, %s) ON CONFLICT (k1, k2) DO "
                            "UPDATE SET v = excluded.v", (k1, k2, f"w{rng.randint(0, 99)}"))
            elif op < 0.8:
                cur.execute("UPDATE c SET v = v || '+' WHERE k1 = %s AND k2 = %s", (k1, k2))
            else:
                cur.execute("DELETE FROM c WHERE k1 = %s AND k2 = %s", (k1, k2))
        elif op < 0.4:
            cur.execute(f"INSERT INTO {table} (id, v) VALUES (%s, %s) ON CONFLICT (id) "
                        "DO UPDATE SET v = excluded.v", (key, f"v{rng.randint(0, 999)}"))
        elif op < 0.7:
            cur.execute(f"UPDATE {table} SET v = v || '+' WHERE id = %s", (key,))
        elif op < 0.85:
            cur.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
        else:  # a primary key change: the old key goes, the new one comes
            cur.execute(f"UPDATE {table} SET id = %s WHERE id = %s AND NOT EXISTS "
                        f"(SELECT 1 FROM {table} WHERE id = %s)",
                        (key + 100_000, key, key + 100_000))


def _assert_targets_equal_source(db: Database, tmp_path: Path, *tables: str) -> None:
    columns = {"a": ["id", "v", "n"], "b": ["id", "v"], "c": ["k1", "k2", "v"]}
    for table in tables:
        source, lake = compare(db.dsn, f"public.{table}", str(tmp_path / "lake" / table),
                               columns[table], scd2=table == "b")
        assert source == lake, f"Delta table {table} differs from the source"
    if "b" in tables:
        history = live_table(DeltaTable(str(tmp_path / "lake/b")))
        versions = Counter(zip(history.column("id").to_pylist(),
                               history.column("__START_AT").to_pylist(), strict=True))
        assert max(versions.values()) == 1, "an SCD2 version was applied twice"


def _run(text: str | None, file: Path, spark: SparkSession) -> list[BatchReport]:
    """Run the pipeline of *file* (rewritten to *text* first, if given) until caught up."""
    if text is not None:
        file.write_text(text)
    reports: list[BatchReport] = []
    Pipeline(load_config(file), spark=spark, on_batch=reports.append).run()
    return reports


def test_a_populated_database_reaches_delta_whole_with_writers_running_during_the_snapshot(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    _populate(db)
    file = _pipeline(tmp_path, db, "a", "b", "c")
    # A running pipeline (not available_now): its stream could run past the snapshot's
    # point while the snapshot is read, which must not let a newer change in first.
    file.write_text(file.read_text().replace("available_now = true",
                                             "trigger_interval_ms = 50"))
    writer = _Writer(db.dsn, seed=7)
    writer.start()
    try:
        with _LivePipeline(load_config(file), spark) as live:
            live.wait_until(lambda: any(r.snapshot for r in live.reports), "a snapshot batch")
            before = writer.committed
            live.wait_until(lambda: len(live.reports) > 2 and not live.reports[-1].snapshot
                            and sum(r.total for r in live.reports
                                    if not r.snapshot) > 50, "the stream after it")
            during = writer.committed - before
            writer.finish()  # the pipeline then stops between two batches
        assert not live.running, "the pipeline did not stop"
        assert not live.failures, live.failures
    finally:
        writer.finish()
    snapshot_batches = [r for r in live.reports if r.snapshot]
    # 3 tables of ~3,000 rows in chunks of 700, 3 chunks a batch: several batches, and
    # the writer committed while they ran.
    assert len(snapshot_batches) >= 4, [r.snapshot for r in live.reports]
    assert "chunk" in snapshot_batches[0].snapshot
    assert during > 0, "no transaction committed while the snapshot ran"
    _run(file.read_text().replace("trigger_interval_ms = 50", "available_now = true"),
         file, spark)  # what the writer did after the first run's end
    _assert_targets_equal_source(db, tmp_path, "a", "b", "c")
    assert live_table(DeltaTable(str(tmp_path / "lake/a"))).num_rows > ROWS / 2


def test_a_target_added_later_is_snapshotted_and_a_never_target_gets_changes_only(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    _populate(db)
    file = _pipeline(tmp_path, db, "a")
    _run(None, file, spark)
    _assert_targets_equal_source(db, tmp_path, "a")
    db.execute("UPDATE a SET v = 'changed' WHERE id <= 10", "DELETE FROM b WHERE id <= 5",
               "UPDATE c SET v = 'before c joined' WHERE k1 = 1")
    # b is added with a snapshot, c with none: c's Delta table gets only what changes
    # from now on.
    file = _pipeline(tmp_path, db, "a", "b", "c")
    text = file.read_text().replace('keys = ["k1", "k2"]\n',
                                    'keys = ["k1", "k2"]\nsnapshot = "never"\n')
    file.write_text(text)
    reports = _run(None, file, spark)
    assert any("public.b" in r.snapshot for r in reports)
    assert not any("public.c" in r.snapshot for r in reports)
    db.execute("UPDATE a SET v = 'after' WHERE id = 20", "UPDATE b SET v = 'after' WHERE id = 20",
               "UPDATE c SET v = 'after c joined' WHERE k1 = 2 AND k2 = 'k,\"2'")
    _run(None, file, spark)
    _assert_targets_equal_source(db, tmp_path, "a", "b")
    c_rows = live_table(DeltaTable(str(tmp_path / "lake/c"))).to_pylist()
    assert [(r["k1"], r["k2"], r["v"]) for r in c_rows] == [(2, 'k,"2', "after c joined")]


def test_the_source_alone_gives_the_rows_as_reads_then_the_changes(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)",
               "INSERT INTO a SELECT g, 'x' || g FROM generate_series(1, 50) g")
    batches: list[dict[str, Any]] = []

    def record(batch: DataFrame, batch_id: int) -> None:
        envelope = batch.toArrow()
        rows = typed_rows(envelope, "public.a", envelope_table_schemas(batch.schema)["public.a"])
        batches.append({"rows": rows.to_pylist()})

    def run() -> None:
        stream = ts.read_changes(spark, dsn=db.dsn, tables=["public.a"], slot=f"s_{db.name}",
                                 publication=f"p_{db.name}", row_format="struct",
                                 snapshot="initial", snapshotChunkRows=20)
        query = (stream.writeStream.foreachBatch(record)
                 .option("checkpointLocation", str(tmp_path / "chk"))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(120)
        assert query.exception() is None

    run()
    db.execute("UPDATE a SET v = 'new' WHERE id = 1", "DELETE FROM a WHERE id = 2")
    run()
    rows = [r for b in batches for r in b["rows"]]
    reads = [r for r in rows if r["_op"] == "r"]
    assert sorted(r["id"] for r in reads) == list(range(1, 51))
    assert len({r["_commit_lsn"] for r in reads}) == 1  # one consistent point
    assert {r["_seq"] for r in reads} == {1}
    changes = [(r["_op"], r["id"], r["v"]) for r in rows if r["_op"] != "r"]
    assert changes == [("u", 1, "new"), ("d", 2, None)]
    assert all(r["_commit_lsn"] > reads[0]["_commit_lsn"] for r in rows if r["_op"] != "r")


def test_a_query_restarted_mid_snapshot_takes_only_the_unfinished_tables_again(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    """The query stops while the snapshot of a and b is in b: the next one takes b again
    from a new snapshot, and a, read whole before, never again (it was forgotten, and
    snapshotted a second time once b was done)."""
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)",
               "CREATE TABLE b (id int PRIMARY KEY, v text)",
               "INSERT INTO a SELECT g, 'a' FROM generate_series(1, 50) g",
               "INSERT INTO b SELECT g, 'b' FROM generate_series(1, 50) g")
    reads: dict[str, list[int]] = {"public.a": [], "public.b": []}

    def record(batch: DataFrame, batch_id: int) -> None:
        envelope = batch.toArrow()
        schemas = envelope_table_schemas(batch.schema)
        for table in reads:
            if table in schemas:
                reads[table] += [r["id"] for r in typed_rows(envelope, table, schemas[table])
                                 .to_pylist() if r["_op"] == "r"]

    def start(**trigger: Any) -> Any:
        stream = ts.read_changes(spark, dsn=db.dsn, tables=["public.a", "public.b"],
                                 slot=f"s_{db.name}", publication=f"p_{db.name}",
                                 row_format="struct", snapshot="initial",
                                 snapshotChunkRows=20, snapshotChunksPerTrigger=1)
        return (stream.writeStream.foreachBatch(record)
                .option("checkpointLocation", str(tmp_path / "chk")).trigger(**trigger)
                .start())

    query = start(processingTime="0 seconds")
    try:
        wait_for(lambda: reads["public.b"] or query.exception(), 120, "b's first chunk")
    finally:
        query.stop()
    assert sorted(reads["public.a"]) == list(range(1, 51))
    assert len(reads["public.b"]) < 50
    query = start(availableNow=True)
    assert query.awaitTermination(120)
    assert query.exception() is None
    assert sorted(reads["public.a"]) == list(range(1, 51))  # not read a second time
    assert set(reads["public.b"]) == set(range(1, 51))


@pytest.mark.slow
def test_sigkill_during_a_snapshot_then_restart_loses_and_doubles_nothing(
        db: Database, tmp_path: Path) -> None:
    _populate(db)
    db.execute(f"INSERT INTO a SELECT g, 'a' || g, 1 FROM generate_series({ROWS + 1}, 30000) g",
               "ANALYZE a")
    file = _pipeline(tmp_path, db, "a", "b", "c")
    file.write_text(file.read_text().replace("snapshotChunksPerTrigger = 3",
                                             "snapshotChunksPerTrigger = 2")
                    .replace("available_now = true", "trigger_interval_ms = 100"))
    log = tmp_path / "run.log"
    writer = _Writer(db.dsn, seed=11)
    writer.start()
    try:
        proc = _tidemark_run(file, log)
        deadline = time.monotonic() + 180
        while len([line for line in _batch_lines(log) if "snapshot public.a" in line]) < 3:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        writer.finish()
    proc = _tidemark_run(file, log, "--available-now")
    assert proc.wait(300) == 0, log.read_text(errors="replace")[-3000:]
    text = log.read_text(errors="replace")
    assert "generation 2" in text or "start again from a new snapshot" in text, text[-3000:]
    _assert_targets_equal_source(db, tmp_path, "a", "b", "c")
    keys = live_table(DeltaTable(str(tmp_path / "lake/a"))).column("id").to_pylist()
    assert len(keys) == len(set(keys)), "a key is twice in the SCD1 table"


def test_chunks_follow_the_key_order_and_hold_the_asked_number_of_rows(db: Database) -> None:
    db.execute("CREATE TABLE n (id int PRIMARY KEY)",
               "INSERT INTO n SELECT g FROM generate_series(1, 2500) g",
               "CREATE TABLE t (k1 int, k2 text, PRIMARY KEY (k1, k2))",
               "INSERT INTO t SELECT g % 3, 'x' || g FROM generate_series(1, 100) g")
    with contextlib.closing(wal.connect(db.dsn, purpose="test")) as conn:
        bounds, after = [], None
        while (after := next_boundary(conn, TableId.parse("public.n"), ("id",), after,
                                      700)) is not None:
            bounds.append(after)
        # By the integer key, not its text ('10' < '7').
        assert bounds == [("700",), ("1400",), ("2100",)]
        composite = next_boundary(conn, TableId.parse("public.t"), ("k1", "k2"), ("0", "x3"),
                                  2)
        expected = sorted((g % 3, f"x{g}") for g in range(1, 101))
        nxt = [k for k in expected if k > (0, "x3")][1]
        assert composite == (str(nxt[0]), nxt[1])


def test_copy_csv_keeps_null_apart_from_the_empty_string_and_quotes_intact() -> None:
    data = b'1,,""\n2,"a,b","line\nbreak ""q"""\n'
    table = parse_csv(data, ["id", "v", "w"])
    assert table.to_pylist() == [{"id": "1", "v": None, "w": ""},
                                 {"id": "2", "v": "a,b", "w": 'line\nbreak "q"'}]
    assert parse_csv(b"", ["id"]).num_rows == 0


def test_the_json_envelope_carries_snapshot_rows_as_reads_after_a_truncate() -> None:
    sink = EnvelopeSink([TableId.parse("public.t")], 100)
    texts = parse_csv(b'1,x\n2,\n', ["id", "v"])
    sink.snapshot("public.t", texts, 1000, 5, True, ("id",))
    sink.snapshot("public.other", texts, 1000, 5, False, ("id",))  # not in the stream
    rows = pa.Table.from_batches(list(sink.finish())).to_pylist()
    assert [(r["_op"], r["_commit_lsn"], r["_seq"], r["key"], r["after"]) for r in rows] == [
        ("t", 1000, 0, None, None),
        ("r", 1000, 1, '{"id":"1"}', '{"id":"1","v":"x"}'),
        ("r", 1000, 1, '{"id":"2"}', '{"id":"2","v":null}')]


def test_a_signal_reloads_a_drifted_target_while_bad_signals_are_skipped(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    _populate(db)
    db.execute(signal_table_ddl(TableId.parse("public.dbz_signal")))
    file = _pipeline(tmp_path, db, "a", "b",
                     source='signal_table = "public.dbz_signal"\n')
    _run(None, file, spark)
    _assert_targets_equal_source(db, tmp_path, "a", "b")
    # The target drifts from the source (restored from an old backup, edited by hand).
    DeltaTable(str(tmp_path / "lake/a")).delete("id <= 100")
    source, lake = compare(db.dsn, "public.a", str(tmp_path / "lake/a"), ["id", "v", "n"])
    assert source != lake
    db.execute("INSERT INTO dbz_signal VALUES ('bad-json', 'execute-snapshot', '{oops')")
    send_signal(db.dsn, "public.dbz_signal", "execute-snapshot",
                {"data-collections": ["public.nope"], "type": "incremental"})
    send_signal(db.dsn, "public.dbz_signal", "execute-snapshot",
                {"data-collections": ["public.a"], "type": "incremental"})
    db.execute("UPDATE a SET v = 'after the signal' WHERE id = 7")
    reports = _run(None, file, spark)
    assert any("snapshot public.a" in r.snapshot for r in reports), [r.snapshot for r in reports]
    assert not any("public.b" in r.snapshot for r in reports)
    _assert_targets_equal_source(db, tmp_path, "a", "b")
    # Taken once: the next run streams only.
    reports = _run(None, file, spark)
    assert not any(r.snapshot for r in reports)


def test_signal_requests_name_what_is_wrong_and_are_taken_once(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    signals = TableId.parse("public.dbz_signal")
    db.execute(signal_table_ddl(signals),
               "INSERT INTO dbz_signal VALUES ('old', 'execute-snapshot', "
               "'{\"data-collections\": [\"public.a\"]}')")
    with contextlib.closing(wal.connect(db.dsn, purpose="test")) as conn:
        check_signal_table(conn, signals)
        with pytest.raises(SourceError, match="CREATE TABLE IF NOT EXISTS"):
            check_signal_table(conn, TableId.parse("public.missing"))
        requested, seen = snapshot_requests(conn, signals, None, ["public.a"])
        assert (requested, seen) == ([], ("old",))  # history, not a request
        db.execute(
            "INSERT INTO dbz_signal VALUES ('bad-json', 'execute-snapshot', '{oops')",
            "INSERT INTO dbz_signal VALUES ('other', 'execute-snapshot', "
            "'{\"data-collections\": [\"public.nope\"]}')",
            "INSERT INTO dbz_signal VALUES ('partial', 'execute-snapshot', "
            "'{\"data-collections\": [\"public.a\"], \"additional-conditions\": "
            "[{\"data-collection\": \"public.a\", \"filter\": \"id > 1\"}]}')",
            "INSERT INTO dbz_signal VALUES ('pause', 'pause-snapshot', NULL)",
            "INSERT INTO dbz_signal VALUES ('good', 'execute-snapshot', "
            "'{\"data-collections\": [\"public.a\"]}')")
        with caplog.at_level("INFO", logger="tidemark.source.signal_requests"):
            requested, seen = snapshot_requests(conn, signals, seen, ["public.a"])
        assert requested == ["public.a"]
        text = caplog.text
        assert "bad-json" in text and "public.nope is not" not in text
        assert "table public.nope skipped: it is not in this stream" in text
        assert "partial skipped" in text and "pause" in text
        assert snapshot_requests(conn, signals, seen, ["public.a"])[0] == []


def test_copy_out_reads_every_row_and_raises_the_server_s_error(db: Database) -> None:
    with contextlib.closing(wal.connect(db.dsn, purpose="test")) as conn:
        data = copy_out(conn, b"COPY (SELECT g FROM generate_series(1, 100000) g) TO STDOUT",
                        10)
        assert data == b"".join(b"%d\n" % g for g in range(1, 100001))
        with pytest.raises(psycopg.errors.UndefinedTable):
            copy_out(conn, b"COPY (SELECT * FROM missing) TO STDOUT", 10)
        assert conn.execute("SELECT 1").fetchone() == (1,)  # still usable


def test_a_lost_export_restarts_the_query_instead_of_stopping_the_pipeline() -> None:
    """An executor finding the snapshot gone (the driver's replication connection cut)
    fails the query; the pipeline restarts it, and the snapshot goes on in a new
    generation."""
    failure = RuntimeError("Traceback …\ntidemark.source.postgres.chunked_snapshot."
                           "SnapshotLostError: snapshot 00000003-1 of public.a is gone "
                           "(invalid snapshot identifier)")
    assert source_unavailable(failure)
    assert not source_unavailable(RuntimeError("ValueError: something else"))
