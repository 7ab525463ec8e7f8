"""Verify's test helpers: a simple PostgreSQL snapshot for a quiet source (the real one,
source/postgres/verify_snapshot.py, takes an exact position through a temporary slot),
and a pipeline run into Delta."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from tidemark.event import TableId
from tidemark.pipeline import load_config
from tidemark.pipeline.runner import Pipeline
from tidemark.postgres_connection import Connection, connect
from tidemark.row_checksum import ChecksumSide, TableShape
from tidemark.source.postgres.checksum import PostgresChecksumSide

SPARK = ('master = "local[1]"\navailable_now = true\n'
         'conf = { "spark.ui.enabled" = "false", "spark.sql.shuffle.partitions" = "1" }')


class QuietSnapshot:
    """A REPEATABLE READ snapshot at ``pg_current_wal_lsn()``, reporting no changed keys
    (right only while nothing writes to the source)."""

    def __init__(self, dsn: str, tables: Sequence[TableId] = ()) -> None:
        self.conn: Connection = connect(dsn, application_name="tidemark verify test")
        self.conn.autocommit = False
        with self.conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cur.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint")
            row = cur.fetchone()
            assert row is not None
            self._position = int(row[0])

    @property
    def position(self) -> int:
        return self._position

    def side(self, table: TableId) -> ChecksumSide:
        return PostgresChecksumSide(self.conn, table)

    def changed_key_hashes(self, table: TableId, shape: TableShape) -> frozenset[int]:
        return frozenset()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.rollback()
        self.conn.close()


def pipeline_file(tmp_path: Path, dsn: str, name: str, targets: str, *,
                  signal: str = "") -> Path:
    """A pipeline.toml of *targets* (TOML of ``[targets."..."]`` sections)."""
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{dsn}"\nslot = "s_{name}"\n'
                    f'publication = "p_{name}"\n{signal}[spark]\ncheckpoint = "chk"\n'
                    f"{SPARK}\n{targets}")
    return file


def run_pipeline(spark: SparkSession, file: Path) -> None:
    """Run the pipeline until it has caught up (available-now)."""
    Pipeline(load_config(file), spark=spark).run()
