"""``tidemark demo --capture``: the change events of a few statements, as JSON lines."""

from __future__ import annotations

import contextlib
import sys

import click

from tidemark import postgres_connection as pgconn
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.source.postgres.config import PostgresSourceConfig
from tidemark.source.postgres.reader import PostgresReader

_SCHEMA = """
CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, email text,
                        balance numeric(12, 2), created timestamptz DEFAULT now());
INSERT INTO customers VALUES (1, 'Ada', 'ada@example.com', 100.50, '2024-01-01 10:00+00'),
                             (2, 'Grace', NULL, 0, '2024-01-02 11:30+00');
"""

_CHANGES = [
    "INSERT INTO customers VALUES (3, 'Linus', 'linus@example.com', 12.34, now())",
    "UPDATE customers SET balance = balance + 1 WHERE id = 1",
    "UPDATE customers SET id = 20 WHERE id = 2",
    "DELETE FROM customers WHERE id = 3",
    "SELECT pg_logical_emit_message(true, 'demo', 'hello from a transaction')",
    "TRUNCATE customers",
]


def capture_demo() -> None:
    """Start a private PostgreSQL, make changes, print the change events as JSON lines."""
    out = sys.stdout
    # Imported here: the cluster helper (tempfile, shutil, secrets …) is not needed by
    # the other commands, whose start-up time counts.
    from tidemark.testing.postgres import PostgresCluster  # noqa: PLC0415

    with PostgresCluster() as cluster:
        dsn = cluster.create_database("demo")
        with contextlib.closing(pgconn.connect(dsn)) as conn, pgconn.cursor(conn) as cur:
            cur.execute(_SCHEMA)
        click.echo(f"# private PostgreSQL on port {cluster.port}; snapshot of 2 rows, "
                   "then live changes:", err=True)
        config = PostgresSourceConfig(dsn=dsn, table_include_list=("public.customers",),
                                      provide_transaction_metadata=False)
        connector = PostgresReader(config)
        serializer = DebeziumJsonSerializer(DebeziumJsonOptions())
        connector.start()
        try:
            done_snapshot = False
            while not done_snapshot:
                batch = connector.poll()
                out.write(serializer.encode_lines(batch.records).decode())
                if batch.offset is not None:
                    connector.commit(batch.offset)
                    done_snapshot = True
            with contextlib.closing(pgconn.connect(dsn)) as conn, pgconn.cursor(conn) as cur:
                for statement in _CHANGES:
                    click.echo(f"# {statement}", err=True)
                    cur.execute(statement)
                cur.execute("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint")
                target = int(cur.fetchone()[0])
            while True:
                batch = connector.poll()
                out.write(serializer.encode_lines(batch.records).decode())
                if batch.offset is not None:
                    connector.commit(batch.offset)
                    if batch.offset["lsn"] >= target:
                        break
        finally:
            connector.stop()
    out.flush()
