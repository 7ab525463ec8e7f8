"""A transaction several times larger than the JVM's heap, of wide rows, through
``tidemark run`` with a deliberately small heap, from every source.

The lesson of issue 34: memory bounds are proven with a small heap and wide rows, not
with the benchmark's narrow shape. Each case makes one transaction of about 600 MB of
change rows (4 KB of incompressible text each) and runs ``tidemark run`` under
``spark.driver.memory = 512m`` (local mode: the one JVM holds the driver and the
executors), with default settings otherwise; the Delta table must then equal the source
row for row. ``benchmarks/bench_memory_bound.py`` measures the peaks (and twice the
heap: 1M rows of 1 KB). Spark refuses a driver heap under 450 MiB (``spark.driver.memory
= 448m``: "System memory 469762048 must be at least 471859200"), so 512m is as small as
these tests can make it; the whole file takes under 4 minutes here.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from conftest import Database, MariaDatabase
from delta_rows import live
from logtable_helpers import LogDb
from pipeline_helpers import _prepare, _tidemark_run
from tidemark.pipeline import load_config
from tidemark.pipeline.runner import Pipeline
from tidemark.testing.postgres import sql_connection

pytestmark = pytest.mark.integration

_ROWS = 150_000
_WIDTH = 4096  # characters of v: hex of random or hashed bytes, which zstd cannot shrink
_HEAP = "512m"
_READ = 20_000  # rows per comparison query


def _spark(heap: str | None) -> str:
    conf = '"spark.ui.enabled" = "false"' + \
        (f', "spark.driver.memory" = "{heap}"' if heap else "")
    return f'available_now = true\nconf = {{ {conf} }}\n'


def _pipeline(tmp_path: Path, source: str, table: str, heap: str | None) -> Path:
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\n{source}\n[spark]\ncheckpoint = "{tmp_path}/chk"\n'
                    f'{_spark(heap)}[targets."{table}"]\npath = "{tmp_path}/lake"\n'
                    'keys = ["id"]\n')
    return file


def _run_small_heap(file: Path, tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    proc = _tidemark_run(file, log, log_level="INFO")
    code = proc.wait(600)
    text = log.read_text(errors="replace")
    assert code == 0, f"tidemark run failed ({code}) under a {_HEAP} heap:\n" + "\n".join(
        line for line in text.splitlines()
        if "Error" in line or "error" in line or "batch" in line)[-4000:]


def _digests(rows: Iterator[tuple[Any, Any]]) -> dict[int, bytes]:
    return {int(i): hashlib.md5((v or "").encode()).digest() for i, v in rows}


def _source_digests(query: Callable[[str], list[tuple[Any, ...]]], table: str
                    ) -> dict[int, bytes]:
    """id -> md5 of v, read in id ranges (the same SQL on every database)."""
    def rows() -> Iterator[tuple[Any, Any]]:
        for lo in range(1, _ROWS + 1, _READ):
            yield from query(f"SELECT id, v FROM {table} WHERE id >= {lo} "
                             f"AND id < {lo + _READ}")
    return _digests(rows())


def _lake_digests(tmp_path: Path) -> dict[int, bytes]:
    dataset = live(DeltaTable(str(tmp_path / "lake")))
    return _digests(row for batch in dataset.to_batches(columns=["id", "v"],
                                                        batch_size=_READ)
                    for row in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                                   strict=True))


def _assert_lake_equals(source: dict[int, bytes], tmp_path: Path) -> None:
    assert len(source) == _ROWS
    lake = _lake_digests(tmp_path)
    assert len(lake) == len(source), f"Delta holds {len(lake)} rows, the source {len(source)}"
    assert lake == source, "Delta's rows differ from the source's"


def test_postgres_transaction_larger_than_the_heap(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")
    source = _prepare(db, "big") + f'dsn = "{db.dsn}"\n'
    db.execute(f"INSERT INTO big SELECT g, (SELECT string_agg(md5(g || '-' || i), '') "
               f"FROM generate_series(1, {_WIDTH // 32}) i) FROM generate_series(1, {_ROWS}) g")
    file = _pipeline(tmp_path, source, "public.big", _HEAP)
    with file.open("a") as out:
        out.write('snapshot = "never"\n')
    _run_small_heap(file, tmp_path)
    _assert_lake_equals(_source_digests(db.query, "big"), tmp_path)


def test_mariadb_transaction_larger_than_the_heap(spark: SparkSession, mdb: MariaDatabase,
                                                  tmp_path: Path) -> None:
    mdb.execute("CREATE TABLE big (id INT PRIMARY KEY, v LONGTEXT)")
    table = f"{mdb.name}.big"
    # The first run snapshots the empty table; the transaction then comes from the binlog.
    Pipeline(load_config(_pipeline(tmp_path, f'dsn = "{mdb.dsn}"\n', table, None)),
             spark=spark).run()
    mdb.execute(f"INSERT INTO big SELECT s.seq, (SELECT GROUP_CONCAT(MD5(CONCAT(s.seq, '-', "
                f"i.seq)) ORDER BY i.seq SEPARATOR '') FROM seq_1_to_{_WIDTH // 32} i) "
                f"FROM seq_1_to_{_ROWS} s")
    _run_small_heap(_pipeline(tmp_path, f'dsn = "{mdb.dsn}"\n', table, _HEAP), tmp_path)
    _assert_lake_equals(_source_digests(mdb.query, "big"), tmp_path)


def test_log_table_transaction_larger_than_the_heap(spark: SparkSession, logdb: LogDb,
                                                    tmp_path: Path) -> None:
    logdb.execute("CREATE TABLE big (id integer PRIMARY KEY, v text)")
    logdb.install(["big"])
    kind = "" if logdb.kind == "sqlite" else 'kind = "logtable"\n'
    source = f'dsn = "{logdb.dsn}"\n{kind}'
    table = logdb.table("big")
    Pipeline(load_config(_pipeline(tmp_path, source, table, None)), spark=spark).run()
    if logdb.kind == "sqlite":
        assert logdb.path is not None
        with contextlib.closing(sqlite3.connect(logdb.path)) as conn, conn:
            conn.execute(f"WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g "
                         f"WHERE i < {_ROWS}) INSERT INTO big SELECT i, "
                         f"lower(hex(randomblob({_WIDTH // 2}))) FROM g")
    else:
        with contextlib.closing(sql_connection(logdb.dsn)) as conn, conn.transaction(), \
                conn.cursor() as cur:
            cur.execute(f"INSERT INTO big SELECT g, (SELECT string_agg(md5(g || '-' || i), "
                        f"'') FROM generate_series(1, {_WIDTH // 32}) i) "
                        f"FROM generate_series(1, {_ROWS}) g")
    _run_small_heap(_pipeline(tmp_path, source, table, _HEAP), tmp_path)
    _assert_lake_equals(_source_digests(logdb.query, "big"), tmp_path)
