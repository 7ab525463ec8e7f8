"""The plan of an incremental snapshot's chunk query on a table without statistics.

Right after a bulk load (before autovacuum's ANALYZE) the planner took each chunk's key
range for a few rows and read the whole rest of the table (a bitmap heap scan and a
sort) for every chunk. The real chunk queries are shown by ``auto_explain`` (as notices
on the snapshot's own connection) and must walk the key's index; where no index has the
key's order a warning says so once.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import psycopg
import pytest

from conftest import Database
from tidemark.event import TableId
from tidemark.postgres_connection import connect
from tidemark.source.postgres.incremental_snapshot import IncrementalSnapshot
from tidemark.source.signals import ExecuteSnapshot

pytestmark = [pytest.mark.integration, pytest.mark.every_pg_version]

CHUNK = 200
ROWS = 60_000


def _explained(db: Database, table: TableId, keys: tuple[str, ...], *,
               surrogate_key: str | None = None, condition: str | None = None,
               chunks: int = 40) -> list[str]:
    """Plans (text) of the chunk queries of the first *chunks* chunks of *table*."""
    plans: list[str] = []

    def explaining() -> psycopg.Connection[Any]:
        conn = connect(db.dsn)
        conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        conn.execute("SET auto_explain.log_min_duration = 0")
        conn.execute("SET auto_explain.log_level = notice")
        conn.execute("SET client_min_messages = notice")
        return conn

    snap = IncrementalSnapshot(dsn_connect=explaining, captured=[table],
                               keys={table: keys}, signal_table=None, chunk_size=CHUNK,
                               topic_prefix="p", database="d")
    snap.on_signal(ExecuteSnapshot(
        id="s", data_collections=(table,), surrogate_key=surrogate_key,
        additional_conditions={table: condition} if condition else {}))
    try:
        for _ in range(chunks):
            snap.windows = []  # as if each window had closed: read the next chunk
            snap.maybe_open_window()
    finally:
        snap.close()
    # The chunk queries (LIMIT grows from CHUNK), not the one for the largest key.
    return [p for p in plans if re.search(r"LIMIT (?!1\b)\d+", p)]


def _assert_index_walk(plans: list[str]) -> None:
    assert len(plans) >= 5, plans
    for plan in plans:
        assert "Index Scan" in plan, plan
        assert "Bitmap" not in plan and "Sort" not in plan and "Seq Scan" not in plan, plan


def _unanalyzed(db: Database, ddl: str, fill: str) -> None:
    # Autovacuum off: the table stays as a bulk load leaves it, without statistics.
    db.execute(ddl, fill)
    assert db.scalar(f"SELECT count(*) FROM pg_stats WHERE tablename = "
                     f"'{ddl.split()[2]}'") == 0


def test_chunks_of_a_never_analyzed_table_walk_the_primary_key(db: Database) -> None:
    _unanalyzed(db, "CREATE TABLE t (id int PRIMARY KEY, v text, n int) "
                    "WITH (autovacuum_enabled = false)",
                f"INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, {ROWS}) g")
    _assert_index_walk(_explained(db, TableId("public", "t"), ("id",)))


def test_chunks_of_a_composite_key_and_a_filter_walk_the_index(db: Database) -> None:
    _unanalyzed(db, "CREATE TABLE c (a int, b text, v text, PRIMARY KEY (a, b)) "
                    "WITH (autovacuum_enabled = false)",
                f"INSERT INTO c SELECT g / 10, (g % 10)::text, 'x' "
                f"FROM generate_series(1, {ROWS}) g")
    table = TableId("public", "c")
    _assert_index_walk(_explained(db, table, ("a", "b")))
    _assert_index_walk(_explained(db, table, ("a", "b"), condition="v = 'x'"))


def test_a_surrogate_key_walks_its_index_or_warns_once(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    _unanalyzed(db, "CREATE TABLE s (id int PRIMARY KEY, k bigint, u bigint, v text) "
                    "WITH (autovacuum_enabled = false)",
                f"INSERT INTO s SELECT g, {ROWS} - g, g, 'v' FROM generate_series(1, {ROWS}) g")
    db.execute("CREATE UNIQUE INDEX s_k ON s (k)")
    table = TableId("public", "s")
    with caplog.at_level(logging.WARNING):
        _assert_index_walk(_explained(db, table, ("id",), surrogate_key="k"))
        assert "no btree index" not in caplog.text
        # No index on u: nothing is forced, and the log says why chunks may be slow.
        plans = _explained(db, table, ("id",), surrogate_key="u", chunks=3)
    assert plans
    warnings = [r for r in caplog.records if "no btree index" in r.getMessage()]
    assert len(warnings) == 1
    assert "(u)" in warnings[0].getMessage()
