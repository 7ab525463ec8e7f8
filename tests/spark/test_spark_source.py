"""The tidemark Spark source against a real PostgreSQL and a real local SparkSession.

Spark takes ~10 s to start, so one session (``local[2]``) serves every test here, and the
tests are few: each checks several guarantees of one scenario.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

import tidemark.spark as ts
from conftest import Database
from tidemark.source.postgres import wal_reads as wal
from tidemark.source.postgres.read_checks import describe_table
from tidemark.source.postgres.read_plan import WalSlice, make_read_plan
from tidemark.spark.change_schemas import envelope_table_schemas, typed_rows
from tidemark.spark.options import SourceOptions
from tidemark.spark.reader import PlanPartition, PlanStreamReader
from tidemark.spark.sources import spark_schema
from tidemark.testing.postgres import sql_connection
from waiting import wait_for

pytestmark = pytest.mark.integration


def _slot_position(db: Database, slot: str) -> int:
    return int(db.scalar("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM "
                         "pg_replication_slots WHERE slot_name = %s", (slot,)))


def _flushed_past(conn: Any, lsn: int) -> int:
    """Wait until the WAL is flushed past *lsn* (the test cluster commits asynchronously)."""
    deadline = time.monotonic() + 10
    while (flushed := wal.flush_lsn(conn)) < lsn:
        assert time.monotonic() < deadline, "WAL flush did not catch up"
        time.sleep(0.05)
    return flushed


def _run_available_now(stream: DataFrame, checkpoint: Path, **sink: Any) -> None:
    writer = stream.writeStream.option("checkpointLocation", str(checkpoint))
    if "foreach_batch" in sink:
        writer = writer.foreachBatch(sink["foreach_batch"])
    else:
        writer = writer.format("parquet").option("path", str(sink["path"]))
    query = writer.trigger(availableNow=True).start()
    assert query.awaitTermination(120), "Trigger.AvailableNow did not stop"
    assert query.exception() is None


def _straddling_workload(db: Database) -> None:
    """Transactions of 3, 4 and 1 changes, and one that straddles the others: its first
    change is written before they commit, its commit after them."""
    with contextlib.closing(sql_connection(db.dsn)) as slow:
        slow_cur = slow.cursor()
        slow_cur.execute("INSERT INTO a VALUES (100, 'early')")  # opens a transaction
        db.execute("INSERT INTO a SELECT g, 'x' FROM generate_series(1, 3) g")
        db.execute("INSERT INTO a SELECT g, 'y' FROM generate_series(4, 7) g")
        db.execute("UPDATE a SET v = 'z' WHERE id = 1")
        slow_cur.execute("INSERT INTO a VALUES (101, 'late')")
        slow.commit()
    db.execute("UPDATE a SET id = 8 WHERE id = 2", "DELETE FROM a WHERE id = 3")


def test_batches_hold_whole_transactions_and_the_slot_moves_only_after_commit(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    slot = f"s_{db.name}"
    stream = ts.read_table(spark, dsn=db.dsn, table="public.a", slot=slot,
                           max_changes_per_trigger=5)
    _run_available_now(stream, tmp_path / "chk", path=tmp_path / "none")  # creates the slot
    _straddling_workload(db)

    batches: list[dict[str, Any]] = []

    def record(batch: DataFrame, batch_id: int) -> None:
        rows = [r.asDict() for r in batch.orderBy("_commit_lsn", "_seq").collect()]
        batches.append({"id": batch_id, "rows": rows, "slot": _slot_position(db, slot)})

    _run_available_now(stream, tmp_path / "chk", foreach_batch=record)

    batches = [b for b in batches if b["rows"]]
    txids = [{r["_txid"] for r in b["rows"]} for b in batches]
    for i, ids in enumerate(txids):  # every transaction lies in exactly one batch
        assert all(not ids & other for other in txids[i + 1:])
    sizes = {r["_txid"]: 0 for b in batches for r in b["rows"]}
    for b in batches:
        for r in b["rows"]:
            sizes[r["_txid"]] += 1
    for b in batches:  # at most 5 changes unless one transaction is bigger
        assert len(b["rows"]) <= 5 or len({r["_txid"] for r in b["rows"]}) == 1
        # The slot never moved past a batch while Spark was still processing it.
        assert b["slot"] <= min(r["_commit_lsn"] for r in b["rows"])
    rows = [r for b in batches for r in b["rows"]]
    straddler = next(r for r in rows if r["id"] == 100)
    late = next(r for r in rows if r["id"] == 101)
    assert straddler["_txid"] == late["_txid"]
    assert straddler["_commit_lsn"] > max(r["_commit_lsn"] for r in rows if r["v"] == "z")
    assert [(r["_op"], r["id"]) for r in rows if r["_txid"] == rows[-1]["_txid"]] == [
        ("d", 2), ("c", 8), ("d", 3)]
    assert len(rows) == 3 + 4 + 1 + 2 + 3
    # After the last batch is committed the slot is released up to its end.
    assert _slot_position(db, slot) > rows[-1]["_commit_lsn"]


def test_a_replayed_range_returns_the_same_rows_however_it_is_split(db: Database) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    slot = f"s_{db.name}"
    options = SourceOptions.parse({"dsn": db.dsn, "table": "public.a", "slot": slot})
    with wal.connect(db.dsn, purpose="test") as conn:
        conn.execute("CREATE PUBLICATION tidemark_spark FOR TABLE a")
        start = wal.ensure_slot(conn, slot)
        _straddling_workload(db)
        end = _flushed_past(conn, db.insert_lsn())
    with contextlib.closing(sql_connection(db.dsn)) as pg:
        schema = spark_schema(describe_table(pg, options.table, ("id",)))  # type: ignore[arg-type]
    reader = PlanStreamReader(options, schema, make_read_plan(options))

    def rows(parts: int) -> list[tuple[Any, ...]]:
        width = max(1, (end - start) // parts)
        cuts = [*range(start, end, width), end]
        return sorted((tuple(r.values()) for lo, hi in itertools.pairwise(cuts)
                       for batch in reader.read(PlanPartition(0, WalSlice(0, lo, hi)))
                       for r in batch.to_pylist()), key=repr)

    whole = rows(1)
    assert len(whole) == 13
    assert rows(1) == whole  # replayed
    assert rows(3) == whole  # split differently: commit-LSN assignment is exact
    assert rows(7) == whole
    assert _slot_position(db, slot) == start  # reading never consumes


def test_restart_from_checkpoint_after_a_stop_delivers_every_change_once(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    slot = f"s_{db.name}"
    stream = ts.read_table(spark, dsn=db.dsn, table="public.a", slot=slot,
                           max_changes_per_trigger=10)
    out, chk = tmp_path / "out", tmp_path / "chk"
    _run_available_now(stream, chk, path=out)  # creates the slot
    for i in range(20):  # 20 transactions of 5 changes
        db.execute(f"INSERT INTO a SELECT g, 'v' FROM generate_series({i * 5}, {i * 5 + 4}) g")
    query = (stream.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(chk)).trigger(processingTime="0 seconds").start())
    try:
        while len([p for p in query.recentProgress if p["numInputRows"]]) < 2:
            assert query.awaitTermination(0.2) is False
    finally:
        query.stop()  # mid-stream: most of the changes are not read yet
    db.execute("UPDATE a SET v = 'w' WHERE id < 7", "DELETE FROM a WHERE id >= 95")
    _run_available_now(stream, chk, path=out)

    rows = spark.read.parquet(str(out)).select("id", "_op", "_commit_lsn", "_seq").collect()
    assert len(rows) == 100 + 7 + 5
    assert len(set(rows)) == len(rows)  # nothing twice
    assert {r.id for r in rows if r._op == "c"} == set(range(100))


def test_envelope_stream_and_table_changes_give_the_typed_rows(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, amount numeric(10,2), at timestamptz, "
               "tags text[], big text)",
               "CREATE TABLE b (k text PRIMARY KEY, n bigint)",
               "ALTER TABLE a ALTER COLUMN big SET STORAGE EXTERNAL")
    envelope = ts.read_changes(spark, dsn=db.dsn, tables=["public.a", "public.b"],
                               slot=f"e_{db.name}", publication="p_env")
    structs = ts.read_changes(spark, dsn=db.dsn, tables=["public.a", "public.b"],
                              slot=f"s_{db.name}", publication="p_env", row_format="struct")
    packed = ts.read_changes(spark, dsn=db.dsn, tables=["public.a", "public.b"],
                             slot=f"p_{db.name}", publication="p_env", row_format="arrow")
    typed = ts.read_table(spark, dsn=db.dsn, table="public.a", slot=f"t_{db.name}",
                          publication="p_env")
    _run_available_now(envelope, tmp_path / "e", path=tmp_path / "none1")
    _run_available_now(structs, tmp_path / "s", path=tmp_path / "none2")
    _run_available_now(packed, tmp_path / "p", path=tmp_path / "none3")
    _run_available_now(typed, tmp_path / "t", path=tmp_path / "typed")
    db.execute("INSERT INTO a VALUES (1, 12.5, '2024-05-06 07:08:09.123456+02', "
               "'{x,\"y z\"}', repeat('L', 10000))",
               "INSERT INTO b VALUES ('k1', 5)")
    db.execute("UPDATE a SET amount = 13 WHERE id = 1")  # big stays TOASTed: unavailable
    db.execute("TRUNCATE b")

    seen: dict[str, list[dict[str, Any]]] = {"envelope": [], "from_envelope": [],
                                             "from_structs": [], "from_packed": [],
                                             "collected": []}

    def split(batch: DataFrame, batch_id: int) -> None:
        seen["envelope"] += [r.asDict() for r in batch.collect()]
        seen["from_envelope"] += [r.asDict() for r in ts.table_changes(batch, "public.a")
                                  .collect()]

    def split_structs(batch: DataFrame, batch_id: int) -> None:
        seen["from_structs"] += [r.asDict() for r in ts.table_changes(batch, "public.a")
                                 .collect()]

    def split_packed(batch: DataFrame, batch_id: int) -> None:
        seen["from_packed"] += [r.asDict() for r in ts.table_changes(batch, "public.a")
                                .collect()]
        # The driver-side unpacking of a collected batch (what `tidemark run` does).
        schema = envelope_table_schemas(batch.schema)["public.a"]
        seen["collected"] += typed_rows(batch.toArrow(), "public.a", schema).to_pylist()

    _run_available_now(envelope, tmp_path / "e", foreach_batch=split)
    _run_available_now(structs, tmp_path / "s", foreach_batch=split_structs)
    _run_available_now(packed, tmp_path / "p", foreach_batch=split_packed)
    _run_available_now(typed, tmp_path / "t", path=tmp_path / "typed")
    direct = [r.asDict() for r in spark.read.parquet(str(tmp_path / "typed")).collect()]

    def key(r: dict[str, Any]) -> tuple[int, int]:
        return r["_commit_lsn"], r["_seq"]

    assert sorted(direct, key=key) == sorted(seen["from_envelope"], key=key)
    assert sorted(direct, key=key) == sorted(seen["from_structs"], key=key)
    assert sorted(direct, key=key) == sorted(seen["from_packed"], key=key)
    assert [{k: r[k] for k in ("id", "amount", "tags", "_op", "_unavailable")} for r in
            sorted(direct, key=key)] == [
        {k: r[k] for k in ("id", "amount", "tags", "_op", "_unavailable")}
        for r in sorted(seen["collected"], key=key)]
    insert, update = sorted(direct, key=key)
    assert str(insert["amount"]) == "12.50" and insert["tags"] == ["x", "y z"]
    assert insert["at"].isoformat().startswith("2024-05-06")  # timestamp (UTC instant)
    assert update["_op"] == "u" and update["big"] is None and update["_unavailable"] == ["big"]
    ops = sorted((r["table"], r["_op"]) for r in seen["envelope"])
    assert ops == [("public.a", "c"), ("public.a", "u"), ("public.b", "c"), ("public.b", "t")]


def test_bad_options_and_tables_fail_at_load_with_clear_errors(
        spark: SparkSession, db: Database) -> None:
    db.execute("CREATE TABLE keyless (v text)", "CREATE TABLE a (id int PRIMARY KEY)")

    def load(**options: str) -> str:
        reader = spark.readStream.format("tidemark")
        for key, value in options.items():
            reader = reader.option(key, value)
        with pytest.raises(Exception) as err:
            reader.load()
        return str(err.value)

    message = load(dsn=db.dsn, tables="public.a", maxChangePerTrigger="5")
    # Spark lower-cases option names before the source sees them.
    assert "maxchangepertrigger:" in message.lower() and "maxChangesPerTrigger" in message
    assert "no primary key" in load(dsn=db.dsn, tables="public.a,public.keyless")
    assert "public.missing not found" in load(dsn=db.dsn, tables="public.missing")
    closed = db.dsn.replace(f"port={db.cluster.port}", "port=1")
    message = load(dsn=closed, table="public.a")
    assert "cannot connect" in message and db.cluster.password not in message


def test_a_peek_fetches_wide_messages_by_bytes_not_by_count(db: Database) -> None:
    """20,000 WAL messages per fetch were a few MB of narrow rows, but 1.2 GB of 60 KB
    ones held by one worker: a fetch is cut at about FETCH_BYTES whatever the width."""
    from tidemark.fetch_budget import FETCH_BYTES, value_bytes  # noqa: PLC0415

    db.execute("CREATE TABLE wide (id int PRIMARY KEY, v text)")
    db.autocommit("CREATE PUBLICATION p_wide FOR TABLE wide")
    with contextlib.closing(wal.connect(db.dsn, purpose="test")) as conn:
        wal.ensure_slot(conn, "s_wide")
        # 1,000 rows of 60 KB (60 MB): TOAST compresses them, the messages carry them whole.
        db.execute("INSERT INTO wide SELECT g, repeat(md5(g::text), 1920) "
                   "FROM generate_series(1, 1000) g")
        with conn.cursor() as cur:
            cur.execute("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint")
            end = int(cur.fetchone()[0])
        # Decoding reads flushed WAL only (the test cluster commits asynchronously).
        wait_for(lambda: wal.flush_lsn(conn) >= end, 30, "the WAL flushed")
        fetches = [sum(value_bytes(m) for m in chunk)
                   for chunk in wal.peek(conn, "s_wide", "p_wide", end)]
    assert sum(fetches) > 60_000_000
    assert max(fetches) <= FETCH_BYTES + 61_440, [f >> 20 for f in fetches]
