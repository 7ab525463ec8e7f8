"""Capture on a real PostgreSQL: every op type, keys, transactions."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from typing import Any

import pytest

from capture_helpers import as_json, drain, events, make_connector, stream_changes
from conftest import Database
from tidemark.errors import SourceError
from tidemark.event import UNAVAILABLE, Op, SnapshotMarker
from tidemark.offsets.memory import MemoryOffsetStore
from waiting import wait_for

# Run on every PostgreSQL version CI tests (scripts/test.sh).
pytestmark = pytest.mark.every_pg_version


def test_every_op_type(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, name text)",
               "INSERT INTO t VALUES (1, 'snap')")
    conn = make_connector(db.dsn, "public.t")
    conn.start()
    try:
        snap = events(drain(conn, db.insert_lsn()))
        assert [(e.op, e.after) for e in snap] == [(Op.READ, {"id": 1, "name": "snap"})]
        assert snap[0].source.snapshot == SnapshotMarker.LAST
        db.autocommit(
            "INSERT INTO t VALUES (2, 'two')",
            "UPDATE t SET name = 'deux' WHERE id = 2",
            "DELETE FROM t WHERE id = 1",
            "SELECT pg_logical_emit_message(true, 'pfx', 'body')",
            "TRUNCATE t",
        )
        got = events(drain(conn, db.insert_lsn()))
    finally:
        conn.stop()
    assert [e.op for e in got] == [Op.CREATE, Op.UPDATE, Op.DELETE, Op.MESSAGE, Op.TRUNCATE]
    create, update, delete, message, truncate = got
    assert create.after == {"id": 2, "name": "two"} and create.key == {"id": 2}
    assert update.before is None and update.after == {"id": 2, "name": "deux"}
    assert delete.before == {"id": 1, "name": None} and delete.key == {"id": 1}
    assert message.message_prefix == "pfx" and message.message_content == b"body"
    assert truncate.table.table == "t" and truncate.before is None and truncate.after is None
    lines = as_json(got)
    assert lines[0]["key"] == {"id": 2}
    assert list(lines[0]["value"]) == ["before", "after", "source", "transaction", "op",
                                       "ts_ms", "ts_us", "ts_ns"]
    assert list(lines[0]["value"]["source"]) == [
        "version", "connector", "name", "ts_ms", "snapshot", "db", "sequence", "ts_us",
        "ts_ns", "schema", "table", "txId", "lsn", "xmin", "origin", "origin_lsn"]
    assert lines[2]["value"]["op"] == "d" and lines[3] == {"key": {"id": 1}, "value": None}
    assert lines[4]["key"] == {"prefix": "pfx"}
    assert list(lines[4]["value"]) == ["op", "ts_ms", "source", "transaction", "message"]
    assert lines[4]["value"]["message"] == {"prefix": "pfx", "content": "Ym9keQ=="}
    assert lines[5]["key"] is None and lines[5]["value"]["op"] == "t"


def test_primary_key_update_is_delete_then_create(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    got = stream_changes(db, ["public.t"], "INSERT INTO t VALUES (1, 'a')",
                         "UPDATE t SET id = 2 WHERE id = 1")
    assert [(e.op, e.key) for e in got] == [
        (Op.CREATE, {"id": 1}), (Op.DELETE, {"id": 1}), (Op.CREATE, {"id": 2})]
    assert got[2].after == {"id": 2, "v": "a"}


def test_replica_identity_full_before_images(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text, n int)",
               "ALTER TABLE t REPLICA IDENTITY FULL")
    got = stream_changes(db, ["public.t"], "INSERT INTO t VALUES (1, 'a', 1)",
                         "UPDATE t SET v = 'b' WHERE id = 1", "UPDATE t SET id = 5 WHERE id = 1",
                         "DELETE FROM t WHERE id = 5")
    assert [e.op for e in got] == [Op.CREATE, Op.UPDATE, Op.DELETE, Op.CREATE, Op.DELETE]
    assert got[1].before == {"id": 1, "v": "a", "n": 1}
    assert got[1].after == {"id": 1, "v": "b", "n": 1}
    assert got[2].before == {"id": 1, "v": "b", "n": 1} and got[3].key == {"id": 5}
    assert got[4].before == {"id": 5, "v": "b", "n": 1}


def _update_beside_a_toasted_value(db: Database, *setup: str) -> tuple[str, list[Any]]:
    """Insert a row with a 100 kB TOASTed text, then update another column."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, big text, n int)",
               "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL", *setup)
    conn = make_connector(db.dsn, "public.t", snapshot_mode="no_data")
    conn.start()
    big = "x" * 100_000
    try:
        drain(conn, db.insert_lsn())
        db.execute("INSERT INTO t VALUES (1, %s, 1)", params=(big,))
        db.autocommit("UPDATE t SET n = 2 WHERE id = 1")
        return big, events(drain(conn, db.insert_lsn()))
    finally:
        conn.stop()


def test_unchanged_toast_is_marked_not_null(db: Database) -> None:
    big, got = _update_beside_a_toasted_value(db)
    assert got[0].after == {"id": 1, "big": big, "n": 1}
    assert got[1].after is not None
    assert got[1].after["big"] is UNAVAILABLE and got[1].after["n"] == 2
    line = as_json([got[1]])[0]
    assert line["value"]["after"]["big"] == "__debezium_unavailable_value"


def test_multi_statement_transaction_order_and_commit_lsn(db: Database) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)")
    conn = make_connector(db.dsn, "public.a", "public.b", snapshot_mode="no_data",
                          provide_transaction_metadata=True)
    conn.start()
    try:
        drain(conn, db.insert_lsn())
        db.execute("INSERT INTO a VALUES (1)", "INSERT INTO b VALUES (1)",
                   "INSERT INTO a VALUES (2)", "UPDATE b SET id = 2")
        records = drain(conn, db.insert_lsn())
    finally:
        conn.stop()
    got = events(records)
    assert [(e.table.table, e.op) for e in got] == [
        ("a", Op.CREATE), ("b", Op.CREATE), ("a", Op.CREATE), ("b", Op.DELETE), ("b", Op.CREATE)]
    assert [e.transaction.total_order for e in got if e.transaction] == [1, 2, 3, 4, 5]
    assert [e.transaction.data_collection_order for e in got if e.transaction] == [1, 1, 2, 2, 3]
    commit_lsns = {e.commit_lsn for e in got}
    assert len(commit_lsns) == 1 and next(iter(commit_lsns)) >= max(e.source.lsn or 0 for e in got)
    assert len({e.source.txid for e in got}) == 1
    lines = as_json(records, transaction_metadata=True)
    assert lines[0]["value"]["status"] == "BEGIN"
    end = lines[-1]["value"]
    assert end["status"] == "END" and end["event_count"] == 5
    assert sorted((d["data_collection"], d["event_count"]) for d in end["data_collections"]) \
        == [("public.a", 2), ("public.b", 3)]
    tx = lines[1]["value"]["transaction"]
    assert list(tx) == ["id", "total_order", "data_collection_order", "commit_lsn",
                        "commit_ts_ms", "commit_ts_us"]
    assert tx["commit_lsn"] == got[0].commit_lsn


def test_alter_table_add_column_mid_stream(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, a text)")
    got = stream_changes(db, ["public.t"], "INSERT INTO t VALUES (1, 'x')",
                         "ALTER TABLE t ADD COLUMN b int", "INSERT INTO t VALUES (2, 'y', 7)",
                         "UPDATE t SET b = 8 WHERE id = 1")
    assert got[0].after == {"id": 1, "a": "x"}
    assert got[1].after == {"id": 2, "a": "y", "b": 7}
    assert got[2].after == {"id": 1, "a": "x", "b": 8}
    assert got[0].schema is not None and got[1].schema is not None
    assert got[1].schema.version == got[0].schema.version + 1


def test_default_identity_delete_uses_debezium_fallbacks_for_not_null_columns(
    db: Database,
) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, name text NOT NULL, active bool NOT NULL, "
               "n int NOT NULL, note text)")
    got = stream_changes(db, ["public.t"], "INSERT INTO t VALUES (1, 'a', true, 5, 'x')",
                         "DELETE FROM t")
    # Python sees what the server sent: only the key.
    assert got[1].before == {"id": 1, "name": None, "active": None, "n": None, "note": None}
    # Debezium's JSON: NOT NULL columns get the type's fallback, nullable ones null.
    assert as_json(got)[1]["value"]["before"] == {
        "id": 1, "name": "", "active": False, "n": 0, "note": None}


def test_column_names_are_data_not_code(db: Database) -> None:
    names = ['}', 'q"\\{', "a{b}", "{len(chr(65)*3)}", "v0", "class", "naïve", "it's"]
    columns = ", ".join('"' + n.replace('"', '""') + '" text' for n in names)
    db.execute(f"CREATE TABLE t (id int PRIMARY KEY, {columns})")
    conn = make_connector(db.dsn, "public.t", snapshot_mode="no_data")
    conn.start()
    try:
        drain(conn, db.insert_lsn())
        placeholders = ", ".join(["%s"] * len(names))
        db.execute(f"INSERT INTO t VALUES (1, {placeholders})", params=names)
        got = events(drain(conn, db.insert_lsn()))
    finally:
        conn.stop()
    expected = {"id": 1, **{n: n for n in names}}
    assert got[0].after == expected
    assert as_json(got)[0]["value"]["after"] == expected


def test_only_captured_tables_stream_even_from_a_wider_publication(db: Database) -> None:
    db.execute("CREATE TABLE t1 (id int PRIMARY KEY)", "CREATE TABLE t2 (id int PRIMARY KEY)",
               "CREATE PUBLICATION everything FOR ALL TABLES")
    got = stream_changes(db, ["public.t1"], "INSERT INTO t2 VALUES (1)",
                         "INSERT INTO t1 VALUES (1)", "TRUNCATE t2",
                         publication_name="everything")
    assert [(e.table.table, e.op) for e in got] == [("t1", Op.CREATE)]


def test_full_identity_update_fills_unchanged_toast_from_the_old_row(db: Database) -> None:
    big, got = _update_beside_a_toasted_value(db, "ALTER TABLE t REPLICA IDENTITY FULL")
    assert got[1].after == {"id": 1, "big": big, "n": 2}


def test_partitioned_table_has_one_name_in_snapshot_and_stream(db: Database) -> None:
    db.execute("CREATE TABLE m (id int PRIMARY KEY) PARTITION BY RANGE (id)",
               "CREATE TABLE m1 PARTITION OF m FOR VALUES FROM (0) TO (100)",
               "INSERT INTO m VALUES (1)")
    conn = make_connector(db.dsn, "public.m")
    conn.start()
    try:
        drain(conn, db.insert_lsn())
        db.autocommit("INSERT INTO m VALUES (2)")
        got = events(drain(conn, db.insert_lsn()))
    finally:
        conn.stop()
    assert {e.table.table for e in got} == {"m"}


@pytest.mark.parametrize("publication", ["FOR TABLE m", "FOR ALL TABLES"])
def test_a_publication_that_names_partitions_instead_of_the_table_is_refused(
        db: Database, publication: str) -> None:
    """A publication of the user's own without publish_via_partition_root sends a
    partitioned table's changes under its partitions' names: each would be dropped as
    not captured. Capture refuses it with the fix, and goes on once it is applied."""
    db.execute("CREATE TABLE m (id int PRIMARY KEY) PARTITION BY RANGE (id)",
               "CREATE TABLE m1 PARTITION OF m FOR VALUES FROM (0) TO (100)",
               f"CREATE PUBLICATION mine {publication}")
    refused = make_connector(db.dsn, "public.m", publication_name="mine")
    with pytest.raises(SourceError, match="publish_via_partition_root") as caught:
        refused.start()
    refused.stop()
    assert "ALTER PUBLICATION mine SET (publish_via_partition_root = true)" in \
        str(caught.value)
    db.execute("ALTER PUBLICATION mine SET (publish_via_partition_root = true)")
    got = stream_changes(db, ["public.m"], "INSERT INTO m VALUES (1)",
                         publication_name="mine")
    assert [(e.table.table, e.after) for e in got] == [("m", {"id": 1})]


def test_partitions_added_and_attached_later_and_generated_columns(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    """Rows of partitions created or attached while capture runs stream under the
    parent's name; stored generated columns are in snapshot and stream alike where the
    server publishes them (18+), else in neither and named at start, as are the
    partition operations no stream carries."""
    db.execute("CREATE TABLE m (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)",
               "CREATE TABLE m1 PARTITION OF m FOR VALUES FROM (0) TO (100)",
               "CREATE TABLE g (id int PRIMARY KEY, a int, "
               "twice int GENERATED ALWAYS AS (a * 2) STORED)",
               "INSERT INTO m VALUES (1, 'one')", "INSERT INTO g VALUES (1, 10)")
    conn = make_connector(db.dsn, "public.m", "public.g")
    with caplog.at_level("INFO", logger="tidemark"):
        conn.start()
    try:
        snapshot = events(drain(conn, db.insert_lsn()))
        db.autocommit("CREATE TABLE m2 PARTITION OF m FOR VALUES FROM (100) TO (200)",
                      "INSERT INTO m VALUES (150, 'new partition')",
                      "CREATE TABLE m3 (id int PRIMARY KEY, v text)",
                      "ALTER TABLE m ATTACH PARTITION m3 FOR VALUES FROM (200) TO (300)",
                      "INSERT INTO m VALUES (250, 'attached')",
                      "UPDATE g SET a = 11 WHERE id = 1")
        streamed = events(drain(conn, db.insert_lsn()))
    finally:
        conn.stop()
    # PostgreSQL 18 publishes stored generated columns (tidemark's publication asks
    # for them): snapshot and stream carry them. Before 18, neither does.
    published = int(db.scalar("SHOW server_version_num")) >= 180000
    g10, g11 = ({"id": 1, "a": 10, "twice": 20}, {"id": 1, "a": 11, "twice": 22}) \
        if published else ({"id": 1, "a": 10}, {"id": 1, "a": 11})
    assert sorted((e.table.table, str(e.after)) for e in snapshot) == [
        ("g", str(g10)), ("m", str({"id": 1, "v": "one"}))]
    assert [(e.op, e.table.table, e.after) for e in streamed] == [
        (Op.CREATE, "m", {"id": 150, "v": "new partition"}),
        (Op.CREATE, "m", {"id": 250, "v": "attached"}),
        (Op.UPDATE, "g", g11)]
    assert ("generated column(s) twice are left out" in caplog.text) is not published
    assert "table public.m is partitioned" in caplog.text and "ATTACH PARTITION" in caplog.text


def test_each_replica_identity_gives_the_before_images_it_can(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    """DEFAULT: no old row on update, the key on delete. FULL: the whole old row.
    USING INDEX on the primary key: as DEFAULT; on other columns: deletes carry only
    those (the start warns, naming the fix). NOTHING: never published (its UPDATEs
    and DELETEs would fail in the application), named at start."""
    identities = {"default": "DEFAULT", "full": "FULL", "pkindex": "USING INDEX {t}_pkey",
                  "uindex": "USING INDEX {t}_u_key", "nothing": "NOTHING"}
    for name, identity in identities.items():
        t = f"ri_{name}"
        db.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, u int NOT NULL UNIQUE, v text)",
                   f"ALTER TABLE {t} REPLICA IDENTITY {identity.format(t=t)}",
                   f"INSERT INTO {t} VALUES (1, 10, 'a'), (2, 20, 'b')")
    conn = make_connector(db.dsn, "public.ri_.*", snapshot_mode="no_data")
    with caplog.at_level("INFO", logger="tidemark"):
        conn.start()
    try:
        drain(conn, db.insert_lsn())
        for name in identities:
            db.autocommit(f"UPDATE ri_{name} SET v = 'x' WHERE id = 1",
                          f"DELETE FROM ri_{name} WHERE id = 2")
        got = events(drain(conn, db.insert_lsn()))
    finally:
        conn.stop()
    seen = {(e.table.table, e.op.value): e.before for e in got}
    assert seen == {
        ("ri_default", "u"): None, ("ri_default", "d"): {"id": 2, "u": None, "v": None},
        ("ri_full", "u"): {"id": 1, "u": 10, "v": "a"},
        ("ri_full", "d"): {"id": 2, "u": 20, "v": "b"},
        ("ri_pkindex", "u"): None, ("ri_pkindex", "d"): {"id": 2, "u": None, "v": None},
        ("ri_uindex", "u"): None, ("ri_uindex", "d"): {"id": None, "u": 20, "v": None}}
    assert "ri_uindex has REPLICA IDENTITY USING INDEX on (u)" in caplog.text
    assert "public.ri_pkindex has REPLICA IDENTITY USING INDEX" not in caplog.text
    assert "ri_nothing has REPLICA IDENTITY NOTHING" in caplog.text
    assert db.scalar("SELECT v FROM ri_nothing WHERE id = 1") == "x"  # the app still works


def test_drop_slot_on_stop(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    conn = make_connector(db.dsn, "public.t", snapshot_mode="no_data", slot_name="dropme",
                          drop_slot_on_stop=True)
    conn.start()
    drain(conn, db.insert_lsn())
    conn.stop()
    assert db.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'dropme'") == []


def test_heartbeat_action_query_runs_while_idle(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)",
               "CREATE TABLE heartbeat (id int PRIMARY KEY, beats int)",
               "INSERT INTO heartbeat VALUES (1, 0)")
    conn = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                          heartbeat_interval_ms=200,
                          heartbeat_action_query="UPDATE heartbeat SET beats = beats + 1")
    conn.start()
    try:
        deadline = time.monotonic() + 20  # ends after three beats (about 1 s) normally
        while time.monotonic() < deadline and db.scalar("SELECT beats FROM heartbeat") < 3:
            batch = conn.poll()
            if batch.offset is not None:
                conn.commit(batch.offset)
    finally:
        conn.stop()
    assert db.scalar("SELECT beats FROM heartbeat") >= 3


def test_cli_transaction_metadata_prefix_and_decimal_mode(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, price numeric(8, 2))")
    env = {**os.environ, "TIDEMARK_DSN": db.dsn}
    argv = [sys.executable, "-m", "tidemark", "capture", "--table", "public.t",
            "--snapshot-mode", "no_data", "--transaction-metadata", "--topic-prefix", "shop",
            "--decimal-handling-mode", "string", "--stop-at-end"]
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=60)  # the slot
    db.execute("INSERT INTO t VALUES (1, 9.50)", "INSERT INTO t VALUES (2, 0.25)")
    done = subprocess.run(argv, env=env, check=True, capture_output=True, timeout=60)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [ln["value"].get("status") for ln in lines] == ["BEGIN", None, None, "END"]
    begin, first, second, end = lines
    assert end["value"]["event_count"] == 2 and begin["key"] == {"id": begin["value"]["id"]}
    assert first["value"]["source"]["name"] == "shop"
    assert [first["value"]["after"]["price"], second["value"]["after"]["price"]] == \
        ["9.50", "0.25"]
    tx = first["value"]["transaction"]
    assert tx["id"] == begin["value"]["id"] == end["value"]["id"]
    assert (tx["total_order"], second["value"]["transaction"]["total_order"]) == (1, 2)


def test_cli_writes_progress_and_wal_lag_to_stderr_while_it_runs(db: Database,
                                                                 tmp_path: Any) -> None:
    """A running capture says on stderr, every --progress-interval-s, how many events it
    wrote and how far behind the server's WAL it is; stdout holds only the events."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY)",
               "INSERT INTO t SELECT generate_series(1, 300)")
    out, err = tmp_path / "out.jsonl", tmp_path / "err.txt"
    env = {**os.environ, "TIDEMARK_DSN": db.dsn}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidemark", "capture", "--table", "public.t",
             "--progress-interval-s", "0.3", "--no-tombstones"],
            stdout=stdout, stderr=stderr, env=env)
    try:
        # The snapshot's 300 rows, then 200 streamed inserts; then the stream is idle.
        wait_for(lambda: "300 change events written" in err.read_text(), 60,
                 "a progress line after the snapshot")
        db.execute("INSERT INTO t SELECT generate_series(301, 500)")
        line = wait_for(lambda: next((ln for ln in err.read_text().splitlines()
                                      if ln.startswith("capture: 500 change events written, "
                                                       "0/s")), None), 60,
                        "an idle progress line after the inserts")
    finally:
        proc.terminate()
        proc.wait(30)
    shape = re.fullmatch(r"capture: 500 change events written, 0/s over the last [0-9.]+ s; "
                         r"at [0-9A-F]+/[0-9A-F]+, ([0-9.]+) (B|KiB) of WAL behind the "
                         r"server; newest event read [0-9.]+ s after its commit", line)
    assert shape is not None, line  # caught up: less than a MiB behind
    assert len(out.read_bytes().splitlines()) == 500  # the progress is not in the events


def test_a_table_that_joins_a_running_capture_is_named_with_what_it_lacks(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    """A table added to the capture after streaming began joins the publication at the
    restart: what it held and what changed in it before is not in the stream. Capture
    says so by name, with how to bring its rows in, and streams it from then on."""
    db.execute("CREATE TABLE a (id int PRIMARY KEY)")
    store = MemoryOffsetStore()
    first = make_connector(db.dsn, "public.a")
    first.start(store=store)
    try:
        target, deadline = db.insert_lsn(), time.monotonic() + 30
        while True:  # as a consumer does: each batch's offset saved, then committed
            assert time.monotonic() < deadline, "capture did not catch up"
            batch = first.poll()
            if batch.offset is not None:
                store.save(first.partition, batch.offset)
                first.commit(batch.offset)
                if batch.offset["lsn"] >= target:
                    break
    finally:
        first.stop()
    db.execute("CREATE TABLE b (id int PRIMARY KEY)", "INSERT INTO b VALUES (1)")
    with caplog.at_level(logging.WARNING, logger="tidemark"):
        got = stream_changes(db, ["public.a", "public.b"], "INSERT INTO b VALUES (2)",
                             store=store)
    joined = [r.getMessage() for r in caplog.records if "joined the capture" in r.getMessage()]
    assert len(joined) == 1 and "public.b" in joined[0] and "execute-snapshot" in joined[0]
    assert [(e.table.table, e.after) for e in got] == [("b", {"id": 2})]
