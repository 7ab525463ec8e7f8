"""Log-table sources on real PostgreSQL and SQLite: every operation, the three column
states, groups and generations, late commits, offsets per group, retention, bad input.

Every test runs on both databases (the ``logdb`` fixture), except where a database lacks
the feature (TRUNCATE, the DDL guard, late commits are PostgreSQL's).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from typing import Any

import psycopg
import pytest

from logtable_helpers import LogDb, drain, reader, replay
from tidemark.errors import ConfigError, SourceError
from tidemark.event import UNAVAILABLE, Op
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.source.logtable import layout
from tidemark.source.logtable.task import LogTableConnector
from tidemark.source.spi import save_offset
from tidemark.testing.postgres import sql_connection

# PostgreSQL 14 or later: hash_record_extended, xid8 snapshots.
pytestmark = pytest.mark.every_pg_version

ORDERS = ("CREATE TABLE orders (id integer PRIMARY KEY, name text, qty integer, "
          "price double precision)")



def _rows(db: LogDb) -> dict[Any, dict[str, Any]]:
    return {(r[0],): {"id": r[0], "name": r[1], "qty": r[2], "price": r[3]}
            for r in db.query("SELECT id, name, qty, price FROM orders")}


def test_every_operation_gives_its_event_with_three_column_states(logdb: LogDb) -> None:
    logdb.execute(ORDERS)
    logdb.install(["orders"])
    logdb.execute("INSERT INTO orders VALUES (1, 'apple', 2, 1.5)",
                  "INSERT INTO orders VALUES (2, 'pear', NULL, 2.0)")
    logdb.execute("UPDATE orders SET name = NULL, qty = 5 WHERE id = 1")
    logdb.execute("UPDATE orders SET id = 3 WHERE id = 2")
    logdb.execute("DELETE FROM orders WHERE id = 1")
    events = drain(reader(logdb))
    by_time = sorted(events, key=lambda e: e.lsn or 0)
    assert [(e.op, e.key) for e in by_time] == [
        (Op.CREATE, {"id": 1}), (Op.CREATE, {"id": 2}), (Op.UPDATE, {"id": 1}),
        (Op.DELETE, {"id": 2}), (Op.CREATE, {"id": 3}), (Op.DELETE, {"id": 1})]
    insert, _, update, pk_delete, pk_create, delete = by_time
    assert insert.after == {"id": 1, "name": "apple", "qty": 2, "price": 1.5}
    # set to NULL, set to a value, unchanged: three states
    assert update.after == {"id": 1, "name": None, "qty": 5, "price": UNAVAILABLE}
    assert update.before is None
    assert pk_delete.before == {"id": 2, "name": UNAVAILABLE, "qty": UNAVAILABLE,
                                "price": UNAVAILABLE}
    assert pk_create.after == {"id": 3, "name": "pear", "qty": None, "price": 2.0}
    assert pk_create.source.fields is not None
    assert pk_create.source.fields["batch_seq_no"] == 1
    assert delete.after is None
    assert replay(events) == _rows(logdb)
    table = logdb.table("orders")
    assert {str(e.table) for e in events} == {table}


def test_cells_are_written_as_scylla_writes_them(logdb: LogDb) -> None:
    logdb.execute(ORDERS)
    logdb.install(["orders"])
    logdb.execute("INSERT INTO orders VALUES (1, 'apple', 2, 1.5)")
    logdb.execute("UPDATE orders SET name = NULL, qty = 5 WHERE id = 1")
    events = sorted(drain(reader(logdb)), key=lambda e: e.lsn or 0)
    lines = DebeziumJsonSerializer(DebeziumJsonOptions(cells=True)).encode_lines(events)
    values = [json.loads(line)["value"] for line in lines.decode().splitlines()]
    assert values[0]["after"] == {"id": 1, "name": {"value": "apple"}, "qty": {"value": 2},
                                  "price": {"value": 1.5}}
    assert values[1]["after"] == {"id": 1, "name": {"value": None}, "qty": {"value": 5},
                                  "price": None}
    source = values[1]["source"]
    assert source["connector"] == ("sqlite" if logdb.kind == "sqlite" else "postgresql")
    assert source["table"] == "orders"
    assert {"stream_id", "generation", "time", "batch_seq_no"} <= set(source)


def test_groups_split_over_tasks_cover_every_change_once(logdb: LogDb) -> None:
    logdb.execute(ORDERS)
    logdb.install(["orders"], streams=32, groups=8)
    logdb.execute(*(f"INSERT INTO orders VALUES ({i}, 'n{i}', {i}, 0)" for i in range(400)))
    logdb.execute("UPDATE orders SET qty = qty + 1 WHERE id % 3 = 0")
    connector = LogTableConnector({"dsn": logdb.dsn})
    configs = connector.task_configs(3)
    assert [list(c["groups"]) for c in configs] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    seen: list[Any] = []
    per_task = []
    for config in configs:
        r = reader(logdb, groups=config["groups"])
        events = drain(r)
        per_task.append(events)
        seen.extend(events)
        groups = {layout.assign_groups(8, 3)[configs.index(config)][0]}
        assert events, f"task of groups {config['groups']} read nothing"
        del groups
    times = [e.lsn for e in seen]
    assert len(times) == len(set(times)) == 400 + 134
    # Every key's changes are read by one task, in order.
    owner: dict[Any, int] = {}
    for index, events in enumerate(per_task):
        for event in events:
            key = event.key["id"] if event.key else None
            assert owner.setdefault(key, index) == index
    state: dict[Any, dict[str, Any]] = {}
    for events in per_task:
        replay(events, state)
    assert state == _rows(logdb)
    # The hash spreads keys: no group is empty or holds more than twice its share.
    counts = [0] * 8
    for event in seen:
        counts[event.source.fields["stream_id"] * 8 // 32] += 1  # type: ignore[index]
    assert min(counts) > 0 and max(counts) < 2 * len(seen) / 8, counts


def test_a_new_generation_keeps_each_key_in_its_group(logdb: LogDb) -> None:
    logdb.execute(ORDERS)
    logdb.install(["orders"], streams=8, groups=4)
    logdb.execute(*(f"INSERT INTO orders VALUES ({i}, 'a', 0, 0)" for i in range(100)))
    logdb.install([], streams=32)  # generation 2
    logdb.execute("UPDATE orders SET qty = 1")
    events = drain(reader(logdb))
    generations = {e.source.fields["generation"] for e in events}  # type: ignore[index]
    assert generations == {1, 2}
    group_of: dict[Any, int] = {}
    for event in events:
        fields = event.source.fields
        assert fields is not None
        streams = 8 if fields["generation"] == 1 else 32
        group = fields["stream_id"] * 4 // streams
        assert group_of.setdefault(event.key["id"], group) == group  # type: ignore[index]
    assert replay(events) == _rows(logdb)
    with pytest.raises(ConfigError, match="groups cannot change"):
        logdb.install([], groups=8)


def test_a_restarted_reader_resumes_from_its_group_offsets(logdb: LogDb) -> None:
    logdb.execute(ORDERS)
    logdb.install(["orders"], streams=16, groups=4)
    logdb.execute(*(f"INSERT INTO orders VALUES ({i}, 'a', 0, 0)" for i in range(200)))
    store = MemoryOffsetStore()
    first = reader(logdb, store=store, max_batch_events=30)
    got = []
    for _ in range(3):
        batch = first.poll()
        got.extend(batch.records)
        assert batch.offset is not None
        save_offset(store, first, batch.offset)
    first.stop()
    keys = set(store.offsets)
    assert keys <= {f"tidemark/logtable/group-{g}" for g in range(4)} and keys
    logdb.execute("UPDATE orders SET name = 'b' WHERE id < 50")
    second = reader(logdb, store=store, max_batch_events=30)
    got.extend(drain(second))
    times = [e.lsn for e in got]
    assert len(times) == len(set(times)) == 250
    assert replay(sorted(got, key=lambda e: e.lsn or 0)) == _rows(logdb)


def test_retention_deletes_only_rows_every_reader_has_passed(logdb: LogDb) -> None:
    logdb.execute(ORDERS)
    logdb.install(["orders"], streams=8, groups=2)
    logdb.execute(*(f"INSERT INTO orders VALUES ({i}, 'a', 0, 0)" for i in range(50)))
    store = MemoryOffsetStore()
    # Reads group 0 only; group 1's rows must stay.
    r = reader(logdb, store=store, groups=(0,), retention_s=0, prune_interval_s=0)
    events = drain(r)
    assert events
    batch = r.poll()
    offset = r._offset()
    save_offset(store, r, offset)
    r.commit(offset)
    del batch
    r.poll()  # prunes
    left = logdb.query('SELECT "cdc$group", count(*) FROM orders_cdc_log GROUP BY 1')
    assert dict(left) == {1: 50 - len(events)}
    # Kept for an hour, nothing is deleted.
    logdb.execute("UPDATE orders SET qty = 1")
    r2 = reader(logdb, store=store, groups=(1,), retention_s=3600, prune_interval_s=0)
    drain(r2)
    save_offset(store, r2, r2._offset())
    r2.commit(r2._offset())
    r2.poll()
    assert logdb.query("SELECT count(*) FROM orders_cdc_log")[0][0] == 100 - len(events)


def test_a_table_without_a_primary_key_is_refused(logdb: LogDb) -> None:
    logdb.execute("CREATE TABLE loose (a integer, b text)")
    with pytest.raises(ConfigError, match=r"loose.*no primary key"):
        logdb.install(["loose"])


def test_a_missing_log_or_description_says_what_to_do(logdb: LogDb) -> None:
    logdb.execute(ORDERS)
    with pytest.raises(ConfigError, match="logtable install"):
        reader(logdb)
    logdb.install(["orders"])
    logdb.execute("CREATE TABLE other (id integer PRIMARY KEY)")
    with pytest.raises(ConfigError, match=r"other.? has no log table"):
        reader(logdb, table_include_list=["other"])
    streams = "tidemark_cdc.streams" if logdb.kind == "postgres" else "tidemark_cdc_streams"
    logdb.execute(f"INSERT INTO {streams} (generation, streams, groups) VALUES (3, 256, 16)")
    with pytest.raises(ConfigError, match="generation 2 is missing"):
        reader(logdb)
    logdb.execute(f"DELETE FROM {streams} WHERE generation = 3",
                  f"UPDATE {streams} SET streams = 100")
    with pytest.raises(ConfigError, match="does not cover the hash space"):
        reader(logdb)


def test_a_column_added_without_the_log_stops_with_a_clear_error(logdb: LogDb) -> None:
    logdb.execute(ORDERS)
    logdb.install(["orders"])
    if logdb.kind == "postgres":
        # The event trigger stops the ALTER itself.
        with pytest.raises(psycopg.Error, match="captured by a tidemark log table"):
            logdb.execute("ALTER TABLE orders ADD COLUMN note text")
    else:
        # SQLite cannot refuse the ALTER; every later write is refused instead.
        logdb.execute("ALTER TABLE orders ADD COLUMN note text")
        with pytest.raises(Exception, match="changed since its tidemark log table"):
            logdb.execute("INSERT INTO orders (id) VALUES (7)")
        with pytest.raises(SourceError, match="note"):
            reader(logdb)
    # The way to change a captured table: in install's own transaction.
    ddl = [] if logdb.kind == "sqlite" else ["ALTER TABLE orders ADD COLUMN note text"]
    logdb.install(["orders"], ddl=ddl)
    logdb.execute("INSERT INTO orders (id, note) VALUES (8, 'hello')")
    events = drain(reader(logdb))
    assert [e.after["note"] for e in events] == ["hello"]  # type: ignore[index]


def test_truncate_is_logged_as_a_delete_per_row(db: Any) -> None:
    logdb = LogDb("postgres", db.dsn)
    logdb.execute(ORDERS)
    logdb.install(["orders"])
    logdb.execute(*(f"INSERT INTO orders VALUES ({i}, 'a', 0, 0)" for i in range(20)))
    logdb.execute("TRUNCATE orders")
    logdb.execute("INSERT INTO orders VALUES (5, 'again', 1, 1)")
    events = drain(reader(logdb))
    assert sum(e.op is Op.DELETE for e in events) == 20
    assert replay(sorted(events, key=lambda e: e.lsn or 0)) == _rows(logdb)


def test_late_commits_are_read_without_a_delay_and_never_twice(db: Any) -> None:
    """A transaction that wrote early (a small cdc$time) and commits after later ones
    were read is still read, once."""
    logdb = LogDb("postgres", db.dsn)
    logdb.execute(ORDERS)
    logdb.install(["orders"], streams=4, groups=1)
    late = sql_connection(db.dsn)
    late_cur = late.cursor()
    late_cur.execute("INSERT INTO orders VALUES (1, 'early', 0, 0)")  # open, uncommitted
    logdb.execute("INSERT INTO orders VALUES (2, 'later', 0, 0)")
    r = reader(logdb)
    first = drain(r)
    assert [e.key for e in first] == [{"id": 2}]
    late.commit()
    late.close()
    second = drain(r)
    assert [e.key for e in second] == [{"id": 1}]
    assert drain(r) == []


def test_interleaved_long_writers_lose_and_repeat_nothing(logdb: LogDb) -> None:
    """Writers with transactions of random length, on overlapping keys, while a reader
    polls: replaying what it read equals the table, and no change is read twice."""
    logdb.execute(ORDERS)
    logdb.install(["orders"], streams=16, groups=4)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with logdb.connection() as conn:
                cur = conn.cursor()
                while not stop.is_set():
                    if logdb.kind == "sqlite":
                        cur.execute("BEGIN IMMEDIATE")
                    else:
                        cur.execute("BEGIN")
                    # Keys in order within a transaction: no deadlocks between writers.
                    for key in sorted(rng.sample(range(60), rng.randint(1, 5))):
                        action = rng.random()
                        if action < 0.5:
                            cur.execute(f"INSERT INTO orders VALUES ({key}, 'w{seed}', "
                                        f"{rng.randint(0, 9)}, 1) ON CONFLICT (id) DO UPDATE "
                                        "SET qty = excluded.qty, name = excluded.name")
                        elif action < 0.8:
                            cur.execute(f"UPDATE orders SET price = {rng.random()} "
                                        f"WHERE id = {key}")
                        else:
                            cur.execute(f"DELETE FROM orders WHERE id = {key}")
                        if rng.random() < 0.3:
                            time.sleep(rng.random() * 0.05)  # a long transaction
                    cur.execute("COMMIT")
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    r = reader(logdb, max_batch_events=50)
    events = []
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        events.extend(r.poll().records)
    stop.set()
    for t in threads:
        t.join()
    events.extend(drain(r))
    assert not errors, errors
    times = [e.lsn for e in events]
    assert len(times) == len(set(times)), "a change was read twice"
    logged = logdb.query('SELECT count(*) FROM orders_cdc_log')[0][0]
    assert len(events) == logged > 100
    state: dict[Any, dict[str, Any]] = {}
    # Within a group the reader's order is the key's order; replay group by group.
    for group in range(4):
        replay([e for e in events
                if e.source.fields["stream_id"] * 4 // 16 == group], state)  # type: ignore[index]
    assert state == _rows(logdb)


def test_a_running_reader_stops_when_a_table_outgrows_its_log(db: Any) -> None:
    """Where no event trigger guards the table (an install without superuser), a reader
    notices a column its log lacks and stops, naming it."""
    logdb = LogDb("postgres", db.dsn)
    logdb.execute(ORDERS)
    logdb.install(["orders"])
    logdb.execute("INSERT INTO orders VALUES (1, 'a', 1, 1)")
    r = reader(logdb, prune_interval_s=0)
    assert len(drain(r)) == 1
    logdb.execute("ALTER EVENT TRIGGER tidemark_cdc_ddl_guard DISABLE")
    logdb.execute("ALTER TABLE orders ADD COLUMN note text")
    with pytest.raises(SourceError, match=r"note .*logtable install"):
        drain(r)


@pytest.mark.parametrize("logged_since", [10, 300])
def test_a_log_installed_again_is_not_read_from_the_old_one_s_positions(
        logdb: LogDb, logged_since: int) -> None:
    """Uninstalling and installing again (how the number of groups changes) starts
    SQLite's clock at 0: saved positions would skip the new log's first changes, fewer or
    more than they count, so the reader refuses them by name. PostgreSQL's positions are
    transaction snapshots, which only grow: it goes on and reads every new change."""
    logdb.execute(ORDERS)
    logdb.install(["orders"], streams=4, groups=2)
    logdb.execute(*(f"INSERT INTO orders VALUES ({i}, 'a', 0, 0)" for i in range(100)))
    store = MemoryOffsetStore()
    first = reader(logdb, store=store)
    for _ in range(20):
        batch = first.poll()
        if batch.offset is not None:
            save_offset(store, first, batch.offset)
    first.stop()
    assert store.offsets
    logdb.uninstall()
    logdb.install(["orders"], streams=4, groups=4)
    logdb.execute(*(f"INSERT INTO orders VALUES ({1000 + i}, 'b', 0, 0)"
                    for i in range(logged_since)))
    if logdb.kind == "sqlite":
        with pytest.raises(ConfigError, match="offsets") as caught:
            reader(logdb, store=store)
        assert "installed again" in str(caught.value) or "earlier install" in str(caught.value)
        assert "Remove this reader's saved positions" in str(caught.value)
        return
    second = reader(logdb, store=store)
    try:
        new = sorted(e.after["id"] for e in drain(second) if e.after)
    finally:
        second.stop()
    assert new == [1000 + i for i in range(logged_since)]


@pytest.mark.parametrize("retention", ["-1", "0"])
def test_the_spark_reader_keeps_the_log_when_retention_is_never(
        logdb: LogDb, retention: str) -> None:
    """retentionS < 0 means never: a committed batch registers its position but deletes
    nothing (it used to make the cutoff a second in the future, deleting everything
    read); 0 deletes what every registered reader has passed."""
    from tidemark.source.logtable.read_plan import LogTableReadPlan  # noqa: PLC0415
    from tidemark.source.logtable.reader import open_database  # noqa: PLC0415
    from tidemark.spark.options import SourceOptions  # noqa: PLC0415

    logdb.execute(ORDERS)
    logdb.install(["orders"], streams=4, groups=2)
    logdb.execute(*(f"INSERT INTO orders VALUES ({i}, 'a', 0, 0)" for i in range(20)))
    options = SourceOptions.parse({"dsn": logdb.dsn, "source": "logtable",
                                   "tables": logdb.table("orders"), "retentionS": retention})
    source = LogTableReadPlan(options)
    with contextlib.closing(open_database(logdb.dsn)) as db:
        end = {"groups": {"0": db.end_position(), "1": db.end_position()}}
    source.commit(end)  # a batch read up to the end now was committed
    assert logdb.query("SELECT count(*) FROM orders_cdc_log") == \
        [(20 if retention == "-1" else 0,)]


def test_a_range_s_bytes_are_the_bytes_its_read_returns(logdb: LogDb) -> None:
    """tidemark run sizes a batch by range_bytes before reading it (collect or spill):
    the bytes of the values read_range returns, wide, multi-byte, null, unchanged and
    deleted alike; on PostgreSQL a compressed, out-of-line value counts whole."""
    from tidemark.source.logtable.database import ROW_OVERHEAD_BYTES  # noqa: PLC0415
    from tidemark.source.logtable.reader import open_database  # noqa: PLC0415

    logdb.execute(ORDERS)
    logdb.install(["orders"], streams=4, groups=2)
    logdb.execute("INSERT INTO orders VALUES (1, 'x', 1, 1.5)")
    with contextlib.closing(open_database(logdb.dsn)) as db:
        tables = db.tables([logdb.table("orders")])
        start = db.end_position()
        wide = "y" * 300_000  # PostgreSQL compresses it to a few KB, out of line
        logdb.execute(f"INSERT INTO orders VALUES (2, '{wide}', 2, 2.5)",
                      f"INSERT INTO orders VALUES (3, '{'é' * 1000}', NULL, 3.5)")
        logdb.execute("UPDATE orders SET qty = 7 WHERE id = 1")
        logdb.execute("DELETE FROM orders WHERE id = 3")
        end = db.end_position()
        rows = [row for page in db.read_range([0, 1], start, end, tables, 2)
                for row in page]
        assert len(rows) == 4
        read = sum(len(v.encode()) if isinstance(v, str) else len(v)
                   for row in rows for v in row.values
                   if v is not None and v is not UNAVAILABLE)
        assert read > 300_000 + 2000
        assert db.range_bytes([0, 1], start, end, tables) == \
            read + len(rows) * ROW_OVERHEAD_BYTES
        # Each group counts only its own rows.
        assert db.range_bytes([0], start, end, tables) + db.range_bytes(
            [1], start, end, tables) == read + len(rows) * ROW_OVERHEAD_BYTES
        assert db.range_bytes([0, 1], end, end, tables) == 0


def test_a_range_is_read_in_pages_bounded_by_bytes(logdb: LogDb) -> None:
    """A page of the Spark source's read was arrowBatchRows (65,536) log rows whatever
    their width: 64 GB of 1 MB rows in one Python list. Pages stop near FETCH_BYTES."""
    from tidemark.fetch_budget import FETCH_BYTES  # noqa: PLC0415
    from tidemark.source.logtable.reader import open_database  # noqa: PLC0415

    logdb.execute("CREATE TABLE wide (id integer PRIMARY KEY, v text)")
    logdb.install(["wide"], streams=4, groups=2)
    mb = "repeat('ab', 524288)" if logdb.kind == "postgres" else \
        "replace(hex(zeroblob(524288)), '00', 'ab')"
    with contextlib.closing(open_database(logdb.dsn)) as db:
        tables = db.tables([logdb.table("wide")])
        start = db.end_position()
        logdb.execute(*(f"INSERT INTO wide VALUES ({i}, {mb})" for i in range(60)))
        pages = [sum(len(r.values[1]) for r in page)
                 for page in db.read_range([0, 1], start, db.end_position(), tables, 65_536)]
        with db.snapshot(tables, 65_536) as (_, chunks):
            loaded = [sum(len(row[1] or "") for row in rows) for _, rows in chunks]
    for read in (pages, loaded):
        assert sum(read) == 60 << 20
        assert max(read) <= FETCH_BYTES + (1 << 20), [p >> 20 for p in read]
