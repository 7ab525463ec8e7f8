"""``tidemark run`` with a MariaDB source: the snapshot, then the binlog, into Delta
tables that equal the source tables (real MariaDB, real local Spark)."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import signal
import threading
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from conftest import MariaDatabase
from delta_rows import live_table
from mariadb_helpers import _run_cli
from tidemark import send_signal
from tidemark.errors import SourceUnavailableError
from tidemark.pipeline import load_config
from tidemark.pipeline.runner import Pipeline, PipelineError
from tidemark.source.signals import SignalError

pytestmark = pytest.mark.integration


def _pipeline(tmp_path: Path, mdb: MariaDatabase, spark: str = "available_now = true",
              extra: str = "", source: str = "") -> Path:
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[source]\ndsn = "{mdb.dsn}"\n{source}\n[spark]\ncheckpoint = "chk"\n{spark}\n'
        f'[targets."{mdb.name}.a"]\npath = "lake/a"\nkeys = ["id"]\n'
        f'[targets."{mdb.name}.b"]\npath = "lake/b"\nkeys = ["k1", "k2"]\n{extra}')
    return file


def _source(mdb: MariaDatabase, table: str, order: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in mdb.query(f"SELECT * FROM {table} ORDER BY {order}")]


def _lake(tmp_path: Path, name: str, columns: list[str]) -> list[tuple[Any, ...]]:
    rows = live_table(DeltaTable(str(tmp_path / "lake" / name))).select(columns)
    return sorted(tuple(r[c] for c in columns) for r in rows.to_pylist())


def test_snapshot_then_binlog_keeps_delta_equal_to_mariadb(
        spark: SparkSession, mdb: MariaDatabase, tmp_path: Path) -> None:
    mdb.execute("CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(20), n DECIMAL(10,2))",
                "CREATE TABLE b (k1 INT, k2 VARCHAR(5), note TEXT, PRIMARY KEY (k1, k2))",
                "INSERT INTO a VALUES " + ",".join(f"({i}, 'v{i}', {i}.25)" for i in range(1, 51)),
                "INSERT INTO b VALUES (1, 'x', 'one'), (2, 'y', 'two')")
    config = load_config(_pipeline(tmp_path, mdb))
    Pipeline(config, spark=spark).run()
    assert _lake(tmp_path, "a", ["id", "v", "n"]) == _source(mdb, "a", "id")
    assert _lake(tmp_path, "b", ["k1", "k2", "note"]) == _source(mdb, "b", "k1, k2")

    mdb.execute("INSERT INTO a VALUES (51, 'new', 1.00)", "UPDATE a SET v = 'upd' WHERE id <= 5",
                "DELETE FROM a WHERE id BETWEEN 10 AND 12", "UPDATE a SET id = 100 WHERE id = 20",
                "UPDATE b SET note = 'changed' WHERE k1 = 1", "DELETE FROM b WHERE k1 = 2")
    mdb.execute("INSERT INTO b VALUES (3, 'z', NULL)")
    reports: list[Any] = []
    Pipeline(config, spark=spark, on_batch=reports.append).run()
    assert sum(r.total for r in reports) == 1 + 5 + 3 + 2 + 1 + 1 + 1
    assert _lake(tmp_path, "a", ["id", "v", "n"]) == _source(mdb, "a", "id")
    assert _lake(tmp_path, "b", ["k1", "k2", "note"]) == _source(mdb, "b", "k1, k2")
    assert (100, "v20", Decimal("20.25")) in _lake(tmp_path, "a", ["id", "v", "n"])

    # Nothing new: nothing written.
    version = DeltaTable(str(tmp_path / "lake/a")).version()
    Pipeline(config, spark=spark).run()
    assert DeltaTable(str(tmp_path / "lake/a")).version() == version

    from tidemark.cli.status import pipeline_status  # noqa: PLC0415
    from tidemark.status import mariadb_pipeline as status  # noqa: PLC0415

    report = pipeline_status(config, str(tmp_path / "pipeline.toml"))
    assert report["healthy"], report["problems"]
    assert report["lag"]["bytes"] == 0 and report["checkpoint"]["last_committed"]
    assert [t["rows"] for t in report["targets"]] == [len(_source(mdb, "a", "id")), 2]
    assert "last committed batch" in status.render_pipeline(report)


def test_max_changes_per_trigger_cuts_the_binlog_at_transaction_ends(
        spark: SparkSession, mdb: MariaDatabase, tmp_path: Path) -> None:
    mdb.execute("CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(20), n DECIMAL(10,2))",
                "CREATE TABLE b (k1 INT, k2 VARCHAR(5), note TEXT, PRIMARY KEY (k1, k2))")
    config = load_config(_pipeline(tmp_path, mdb, source="maxChangesPerTrigger = 7"))
    Pipeline(config, spark=spark).run()  # the empty snapshot; the stream starts here
    for tx in range(6):  # transactions of 4 changes: at most one per batch of 7
        mdb.execute(*(f"INSERT INTO a VALUES ({tx * 4 + i}, 'x', 1)" for i in range(4)))
    mdb.execute("INSERT INTO a VALUES " + ",".join(f"({100 + i}, 'big', 2)" for i in range(10)))
    reports: list[Any] = []
    Pipeline(config, spark=spark, on_batch=reports.append).run()
    sizes = [r.total for r in reports if r.total]
    assert sizes == [4, 4, 4, 4, 4, 4, 10]  # whole transactions; the big one alone
    assert _lake(tmp_path, "a", ["id", "v", "n"]) == _source(mdb, "a", "id")


def test_an_execute_snapshot_signal_repairs_a_drifted_target(
        spark: SparkSession, mdb: MariaDatabase, tmp_path: Path) -> None:
    mdb.execute("CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(20), n DECIMAL(10,2))",
                "CREATE TABLE b (k1 INT, k2 VARCHAR(5), note TEXT, PRIMARY KEY (k1, k2))",
                "CREATE TABLE dbz_signal (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT "
                "NULL, data VARCHAR(2048))",
                "INSERT INTO dbz_signal VALUES ('old', 'execute-snapshot', "
                f"'{{\"data-collections\": [\"{mdb.name}.a\"]}}')",  # history, not a request
                "INSERT INTO a VALUES " + ",".join(f"({i}, 'v', 1)" for i in range(1, 21)))
    config = load_config(_pipeline(tmp_path, mdb,
                                   source=f'signal_table = "{mdb.name}.dbz_signal"'))
    Pipeline(config, spark=spark).run()
    assert _lake(tmp_path, "a", ["id", "v", "n"]) == _source(mdb, "a", "id")
    DeltaTable(str(tmp_path / "lake/a")).delete("id <= 5")  # the target drifts
    version = DeltaTable(str(tmp_path / "lake/a")).version()
    Pipeline(config, spark=spark).run()
    assert DeltaTable(str(tmp_path / "lake/a")).version() == version  # no new request

    send_signal(mdb.dsn, f"{mdb.name}.dbz_signal", "execute-snapshot",
                {"data-collections": [f"{mdb.name}.a"]})
    # The stream before the reload ends with a transaction of two changes to a: the
    # target's mark is then its commit and the second change, which the reload's rows
    # (at that commit) must not fall behind, or they are all dropped as applied.
    mdb.execute("UPDATE a SET v = 'after' WHERE id >= 19")
    with pytest.raises(SignalError, match="does not exist"):
        send_signal(mdb.dsn, f"{mdb.name}.nope", "log", {"message": "x"})
    Pipeline(config, spark=spark).run()
    assert _lake(tmp_path, "a", ["id", "v", "n"]) == _source(mdb, "a", "id")


class _Writer(threading.Thread):
    """Small random transactions on a (ids 1..40 churn) until :meth:`finish`."""

    def __init__(self, mdb: MariaDatabase, seed: int) -> None:
        super().__init__(daemon=True)
        self.mdb = mdb
        self.rng = random.Random(seed)
        self.committed = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        rng = self.rng
        try:
            conn = self.mdb.server.connect(self.mdb.name)
            with contextlib.closing(conn), conn.cursor() as cur:
                while not self._halt.is_set() and self.committed < 500:
                    cur.execute("BEGIN")
                    for _ in range(rng.randint(1, 4)):
                        key, op = rng.randint(1, 40), rng.random()
                        if op < 0.5:
                            cur.execute("INSERT INTO a VALUES (%s, %s, 1) ON DUPLICATE KEY "
                                        "UPDATE v = VALUES(v)", (key, f"v{rng.randint(0, 999)}"))
                        elif op < 0.8:
                            cur.execute("UPDATE a SET n = n + 1 WHERE id = %s", (key,))
                        else:
                            cur.execute("DELETE FROM a WHERE id = %s", (key,))
                    cur.execute("COMMIT")
                    self.committed += 1
                    time.sleep(0.02)  # pacing the writer, not waiting for a condition
        except BaseException as err:  # reported by finish()
            self.error = err

    def finish(self) -> None:
        self._halt.set()
        self.join(30)
        assert not self.is_alive(), "the writer did not stop"
        if self.error is not None:
            raise self.error


@pytest.mark.slow
def test_sigkill_mid_stream_then_restart_loses_and_doubles_nothing(
        mdb: MariaDatabase, tmp_path: Path) -> None:
    mdb.execute("CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(20), n DECIMAL(10,2))",
                "CREATE TABLE b (k1 INT, k2 VARCHAR(5), note TEXT, PRIMARY KEY (k1, k2))",
                "INSERT INTO a VALUES (1, 'first', 1)")
    config = _pipeline(tmp_path, mdb, "trigger_interval_ms = 50",
                       '\n[changelog]\npath = "lake/_changes"\n')
    log = tmp_path / "run.log"
    writer = _Writer(mdb, seed=7)
    proc = _run_cli(config, log)
    try:
        deadline = time.monotonic() + 120
        while "batch " not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, \
                log.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
        writer.start()
        time.sleep(random.Random(7).uniform(1.0, 3.0))  # the kill's moment, not a wait
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert writer.is_alive(), "the writer had stopped: the kill was not mid-stream"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    at_kill = writer.committed
    deadline = time.monotonic() + 30
    while writer.committed < at_kill + 20:  # changes after the crash too
        assert writer.is_alive() and time.monotonic() < deadline
        time.sleep(0.02)
    writer.finish()
    restart = _run_cli(config, log, "--available-now")
    assert restart.wait(180) == 0, log.read_text(errors="replace")[-3000:]
    assert _lake(tmp_path, "a", ["id", "v", "n"]) == _source(mdb, "a", "id")
    changelog = pq.read_table(tmp_path / "lake/_changes")
    changes = Counter(zip(changelog.column("table").to_pylist(),
                          changelog.column("_commit_lsn").to_pylist(),
                          changelog.column("_seq").to_pylist(), strict=True))
    assert changes and max(changes.values()) == 1, "a change is twice in the change log"


def test_every_type_reaches_delta_with_its_spark_type(
        spark: SparkSession, mdb: MariaDatabase, tmp_path: Path) -> None:
    from mariadb_helpers import ALL_TYPES, ROW_1  # noqa: PLC0415

    mdb.execute(ALL_TYPES, ROW_1)  # row 1 arrives through the snapshot
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{mdb.dsn}"\n[spark]\ncheckpoint = "chk"\n'
                    f'available_now = true\n[targets."{mdb.name}.everything"]\n'
                    'path = "lake/e"\nkeys = ["id"]\n')
    config = load_config(file)
    Pipeline(config, spark=spark).run()
    mdb.execute(ROW_1.replace("VALUES (1,", "VALUES (3,", 1),  # the same through the binlog
                "INSERT INTO everything (id) VALUES (2)")
    Pipeline(config, spark=spark).run()
    rows = {r["id"]: r for r in live_table(DeltaTable(str(tmp_path / "lake/e")))
            .to_pylist()}
    assert sorted(rows) == [1, 2, 3]
    expected = {
        "ti": -128, "tu": 255, "si": -32768, "su": 65535, "mi": -8388608, "mu": 16777215,
        "i": -2147483648, "iu": 4294967295, "bi": -9223372036854775808, "bu": -1,
        "d": 2.2, "dec1": Decimal("-12.34"), "dec2": Decimal("-123456789012345678.9012345678"),
        "dec3": Decimal("99999"), "b1": True, "b9": b"\x01\x01", "y": 2024,
        "dt": dt.date(2024, 2, 29), "tm": "-838:59:59.123", "tm0": "12:00:00",
        "dtm": dt.datetime(2024, 1, 2, 3, 4, 5, 678901),
        "dtm0": dt.datetime(1999, 12, 31, 23, 59, 59),
        "ts": dt.datetime(2024, 6, 1, 12, 0, 0, 500000, tzinfo=dt.UTC), "c": "ab",
        "vc": "x" * 300, "tx": "h\u00e9llo", "bn": b"ab\x00\x00", "vb": b"\x00\xff",
        "bl": b"\xde\xad\xbe\xef", "e": "b", "s": "x,z", "j": '{"a": 1}', "lat": "caf\u00e9",
    }
    for row_id in (1, 3):  # snapshot and stream give the same values
        got = {k: rows[row_id][k] for k in expected}
        assert abs(rows[row_id]["f"] - 1.1) < 1e-6
        assert got == expected, row_id
    assert all(v is None for k, v in rows[2].items() if k in expected)


def test_the_spark_source_reads_transactions_larger_than_it_holds_in_memory(
        spark: SparkSession, mdb: MariaDatabase, tmp_path: Path) -> None:
    """arrowBatchRows = 5: the binlog readers (the driver sizing a batch, the executor
    reading it) hold a transaction's rows events until 5 rows, and keep the rest in a
    temporary file; batches still end at transaction ends and hold every change once.
    (Rows of 500 bytes: a rows event holds about 8 KB, so these span many events.)"""
    import tidemark.spark as ts  # noqa: PLC0415

    mdb.execute("CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(600))")
    stream = ts.read_table(spark, dsn=mdb.dsn, table=f"{mdb.name}.a",
                           max_changes_per_trigger=300, arrowBatchRows=5)
    batches: list[list[tuple[int, str, str]]] = []

    def collect(batch: Any, batch_id: int) -> None:
        rows = sorted((r["id"], r["_op"], r["v"]) for r in batch.select("id", "_op", "v")
                      .collect())
        if rows:
            batches.append(rows)

    def run() -> None:
        query = (stream.writeStream.option("checkpointLocation", str(tmp_path / "chk"))
                 .foreachBatch(collect).trigger(availableNow=True).start())
        assert query.awaitTermination(120), "Trigger.AvailableNow did not stop"
        assert query.exception() is None

    run()  # the empty table's snapshot; the stream starts here
    x, y = "x" * 500, "y" * 500
    mdb.execute(f"INSERT INTO a SELECT seq, '{x}' FROM seq_1_to_400")
    mdb.execute(f"UPDATE a SET v = '{y}' WHERE id <= 120")
    mdb.execute(f"INSERT INTO a SELECT seq, '{x}' FROM seq_401_to_403",
                "DELETE FROM a WHERE id BETWEEN 301 AND 400")
    run()
    # The first transaction alone (larger than the 300 a batch allows), then the others.
    assert batches == [
        [(i, "c", x) for i in range(1, 401)],
        sorted([(i, "u", y) for i in range(1, 121)] + [(i, "c", x) for i in range(401, 404)]
               + [(i, "d", x) for i in range(301, 401)])]


def test_a_snapshot_read_view_behind_its_planned_position_is_not_used(
        mdb: MariaDatabase) -> None:
    """InnoDB commits after the binlog write, so a read view opened right after the
    driver planned a snapshot at P may still miss a transaction the binlog holds before
    P: the stream starts at P, and that transaction would be in neither. The executor
    opens views until one is at or after P (here P is beyond the binlog's end: never)."""
    from tidemark.source.mariadb import client  # noqa: PLC0415
    from tidemark.source.mariadb.position import BinlogPosition  # noqa: PLC0415
    from tidemark.source.mariadb.read_plan import read_view_from  # noqa: PLC0415

    conn = client.connect(client.parse_url(mdb.dsn))
    with contextlib.closing(conn):
        now = client.current_position(conn)
        assert read_view_from(conn, now).key >= now.key
        conn.rollback()
        ahead = BinlogPosition(now.file, now.pos + 10**9, now.gtids)
        with pytest.raises(SourceUnavailableError, match="stayed behind"):
            read_view_from(conn, ahead)


def test_a_column_renamed_before_its_changes_were_read_stops_with_what_to_do(
        spark: SparkSession, mdb: MariaDatabase, tmp_path: Path) -> None:
    """The binlog names a row's columns as they were, by position only: a rename and a
    DROP plus ADD look the same, so the run stops once, saying so, instead of asking
    for restarts that cannot help."""
    mdb.execute("CREATE TABLE a (id INT PRIMARY KEY, v INT)",
                "CREATE TABLE b (k1 INT, k2 VARCHAR(5), PRIMARY KEY (k1, k2))",
                "INSERT INTO a VALUES (1, 1), (2, 2), (3, 3)")
    file = _pipeline(tmp_path, mdb)
    Pipeline(load_config(file), spark=spark).run()
    mdb.execute("ALTER TABLE a ADD COLUMN c1 INT", "UPDATE a SET c1 = id * 10 WHERE id <= 2",
                "ALTER TABLE a RENAME COLUMN c1 TO c1r", "UPDATE a SET v = v + 1 WHERE id = 3")
    for _ in range(2):  # the same line again after a restart
        with pytest.raises(PipelineError) as stopped:
            Pipeline(load_config(file), spark=spark).run()
        message = str(stopped.value)
        assert f"table {mdb.name}.a:" in message and "c1" in message
        assert "restarting does not help" in message
        assert 'onSchemaChange = "drop_new_columns"' in message
    # The way out it names goes on (c1's values wait for the reload it also names).
    file.write_text(file.read_text().replace(
        "[source]\n", '[source]\nonSchemaChange = "drop_new_columns"\n'))
    Pipeline(load_config(file), spark=spark).run()
    assert _lake(tmp_path, "a", ["id", "v"]) == [(1, 1), (2, 2), (3, 4)]
