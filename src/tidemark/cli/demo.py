"""``tidemark demo``: PostgreSQL → Spark → Delta Lake on a private cluster, end to end.

Starts a private PostgreSQL, creates a small shop schema, makes changes (inserts,
updates, a primary-key change, deletes, an update that leaves a TOASTed value unchanged,
a large transaction), writes a ``pipeline.toml`` into a temporary directory and runs it
with ``available_now`` twice (more changes in between), then proves every Delta table
equals its PostgreSQL table. ``--capture`` prints the raw change events instead.
``--source mariadb`` does the same on a private MariaDB (snapshot, then the binlog),
``--source sqlite`` on a SQLite file captured through log tables.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tidemark.errors import TerminalError

_PUBLICATION = "demo_lake"
_SLOT = "demo_lake"

_SCHEMA = """
CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, email text,
                        balance numeric(12, 2), created timestamptz DEFAULT now());
CREATE TABLE products (id int PRIMARY KEY, name text, price numeric(10, 2), attrs jsonb,
                       manual text);
-- Out of line and uncompressed, so an update of another column sends the manual as
-- "unchanged TOAST" (pgoutput leaves the value out; apply_changes keeps the target's).
ALTER TABLE products ALTER COLUMN manual SET STORAGE EXTERNAL;
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, product_id int, qty int,
                     status text, placed timestamptz DEFAULT now());
CREATE PUBLICATION demo_lake FOR TABLE customers, products, orders;
"""

_ROUND_1 = [
    "INSERT INTO customers VALUES (1, 'Ada', 'ada@example.com', 100.50), "
    "(2, 'Grace', NULL, 0), (3, 'Linus', 'linus@example.com', 12.34)",
    "INSERT INTO products VALUES (1, 'kettle', 39.90, '{\"color\": \"red\"}', "
    "repeat('Boil water. ', 2000)), (2, 'teapot', 24.00, '{\"size\": [1, 2]}', 'Pour.')",
    # A large transaction: 5,000 orders at once.
    "INSERT INTO orders SELECT g, 1 + g % 3, 1 + g % 2, 1 + g % 5, 'new', "
    "'2024-05-01 12:00+00'::timestamptz + g * interval '1 minute' "
    "FROM generate_series(1, 5000) g",
    "UPDATE customers SET balance = balance + 1 WHERE id = 1",
    "UPDATE products SET price = 34.90 WHERE id = 1",          # manual: unchanged TOAST
    "UPDATE customers SET id = 20 WHERE id = 2",               # primary-key change
    "DELETE FROM customers WHERE id = 3",
    "UPDATE orders SET status = 'paid' WHERE id % 4 = 0",
]

_ROUND_2 = [
    "INSERT INTO customers VALUES (4, 'Edsger', 'ewd@example.com', 7)",
    "UPDATE orders SET status = 'shipped' WHERE status = 'paid' AND id % 8 = 0",
    "DELETE FROM orders WHERE id > 4900",
    "UPDATE products SET attrs = attrs || '{\"sale\": true}' WHERE id = 1",
    "UPDATE customers SET email = 'grace@example.com' WHERE id = 20",
]

_TARGETS = {  # table -> SCD type (key: id)
    "public.customers": 1, "public.products": 1, "public.orders": 2,
}

# The MariaDB round: the same shop; its first changes come before the pipeline's first
# run, so they arrive through the initial snapshot, the second round through the binlog.
_MARIADB_SCHEMA = [
    "CREATE TABLE customers (id BIGINT PRIMARY KEY, name VARCHAR(40) NOT NULL, "
    "email VARCHAR(80), balance DECIMAL(12, 2), created TIMESTAMP(6) NULL "
    "DEFAULT CURRENT_TIMESTAMP(6))",
    "CREATE TABLE products (id INT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10, 2), "
    "attrs JSON, manual LONGTEXT)",
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, customer_id BIGINT, product_id INT, "
    "qty INT, status VARCHAR(10), placed DATETIME)",
]
_MARIADB_ROUND_1 = [
    "INSERT INTO customers (id, name, email, balance) VALUES (1, 'Ada', 'ada@example.com', "
    "100.50), (2, 'Grace', NULL, 0), (3, 'Linus', 'linus@example.com', 12.34)",
    "INSERT INTO products VALUES (1, 'kettle', 39.90, '{\"color\": \"red\"}', "
    "REPEAT('Boil water. ', 2000)), (2, 'teapot', 24.00, '{\"size\": [1, 2]}', 'Pour.')",
    "INSERT INTO orders SELECT seq, 1 + seq % 3, 1 + seq % 2, 1 + seq % 5, 'new', "
    "TIMESTAMP'2024-05-01 12:00:00' + INTERVAL seq MINUTE FROM seq_1_to_5000",
]
_MARIADB_ROUND_2 = [
    "UPDATE customers SET balance = balance + 1 WHERE id = 1",
    "UPDATE products SET price = 34.90 WHERE id = 1",
    "UPDATE customers SET id = 20 WHERE id = 2",               # primary-key change
    "DELETE FROM customers WHERE id = 3",
    "UPDATE orders SET status = 'paid' WHERE id % 4 = 0",
    "INSERT INTO customers (id, name, email, balance) VALUES (4, 'Edsger', "
    "'ewd@example.com', 7)",
    "DELETE FROM orders WHERE id > 4900",
    "UPDATE products SET attrs = JSON_SET(attrs, '$.sale', true) WHERE id = 1",
]


# The SQLite round: the shop in a file, captured through log tables (triggers write the
# changes beside each table; no server). Round 1 comes before the pipeline's first run and
# arrives through the initial snapshot; round 2 through the log, whose partial updates
# (only the columns that changed) leave the other columns to the Delta rows.
_SQLITE_SCHEMA = [
    "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT, "
    "balance REAL)",
    "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, price REAL, attrs TEXT, "
    "manual TEXT)",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, product_id INTEGER, "
    "qty INTEGER, status TEXT, placed TEXT)",
]
_SQLITE_ROUND_1 = [
    "INSERT INTO customers VALUES (1, 'Ada', 'ada@example.com', 100.5), "
    "(2, 'Grace', NULL, 0), (3, 'Linus', 'linus@example.com', 12.34)",
    "INSERT INTO products VALUES (1, 'kettle', 39.9, '{\"color\": \"red\"}', "
    "'Boil water.'), (2, 'teapot', 24.0, '{\"size\": [1, 2]}', 'Pour.')",
    "WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < 5000) "
    "INSERT INTO orders SELECT x, 1 + x % 3, 1 + x % 2, 1 + x % 5, 'new', "
    "datetime('2024-05-01 12:00', '+' || x || ' minutes') FROM g",
]
_SQLITE_ROUND_2 = [
    "UPDATE customers SET balance = balance + 1 WHERE id = 1",
    "UPDATE products SET price = 34.9 WHERE id = 1",           # only price is logged
    "UPDATE customers SET id = 20 WHERE id = 2",               # primary-key change
    "DELETE FROM customers WHERE id = 3",
    "UPDATE orders SET status = 'paid' WHERE id % 4 = 0",
    "INSERT INTO customers VALUES (4, 'Edsger', 'ewd@example.com', 7)",
    "DELETE FROM orders WHERE id > 4900",
    "UPDATE customers SET email = NULL WHERE id = 1",          # set to NULL, not unchanged
]


#: The demos, by ``--source`` (a demo's database, not a source kind): the first is the
#: default. ``--capture`` applies to PostgreSQL's. (Lambdas: the demos are defined below.)
_DEMOS: tuple[tuple[str, Callable[[bool, bool], None]], ...] = (
    ("postgres", lambda capture, keep: _postgres_demo(capture, keep)),  # noqa: PLW0108
    ("mariadb", lambda capture, keep: _mariadb_demo(keep)),
    ("sqlite", lambda capture, keep: _sqlite_demo(keep)),
)


class DemoMismatchError(TerminalError):
    """A Delta table does not equal its source table at the end of the demo."""


@click.command()
@click.option("--capture", is_flag=True,
              help="Only print the change events of a few statements as JSON lines.")
@click.option("--keep", is_flag=True, help="Keep the demo directory (pipeline.toml, Delta "
                                           "tables) and print its path.")
@click.option("--source", type=click.Choice([name for name, _ in _DEMOS]),
              default=_DEMOS[0][0], show_default=True,
              help="The source database: a private PostgreSQL, a private MariaDB (Debian's "
                   "mariadb-server), or a SQLite file captured through log tables.")
def demo(capture: bool, keep: bool, source: str) -> None:
    """Database changes into Delta Lake through Spark, on a private PostgreSQL, MariaDB or
    SQLite."""
    dict(_DEMOS)[source](capture, keep)


def _postgres_demo(capture: bool, keep: bool) -> None:
    if capture:
        from tidemark.cli.demo_capture import capture_demo  # noqa: PLC0415

        capture_demo()
        return
    # Imported here: Spark and the cluster helper are slow to import, other commands
    # should not pay for them.
    from tidemark.testing.postgres import PostgresCluster  # noqa: PLC0415

    directory = Path(tempfile.mkdtemp(prefix="tidemark-demo-"))
    with PostgresCluster() as cluster:
        dsn = cluster.create_database("demo")
        click.echo(f"private PostgreSQL on port {cluster.port}; demo directory {directory}")
        _prepare(dsn)
        config_file = _write_pipeline(directory, dsn)
        _run_demo(dsn, config_file)
    if not keep:
        import shutil  # noqa: PLC0415

        shutil.rmtree(directory, ignore_errors=True)


def _mariadb_demo(keep: bool) -> None:
    import shutil  # noqa: PLC0415

    from tidemark.testing.mariadb import MariaDbServer  # noqa: PLC0415

    directory = Path(tempfile.mkdtemp(prefix="tidemark-demo-"))
    with MariaDbServer() as server:
        conn = server.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute("CREATE DATABASE shop")
            cur.execute("USE shop")
            for statement in _MARIADB_SCHEMA:
                cur.execute(statement)
        dsn = server.dsn("shop")
        click.echo(f"private MariaDB on port {server.port}; demo directory {directory}")
        config_file = _write_simple_pipeline(directory, dsn, "shop")
        _run_demo(dsn, config_file, (_MARIADB_ROUND_1, _MARIADB_ROUND_2), "MariaDB")
    if not keep:
        shutil.rmtree(directory, ignore_errors=True)


def _sqlite_demo(keep: bool) -> None:
    import shutil  # noqa: PLC0415
    import sqlite3  # noqa: PLC0415

    from tidemark.source.logtable import sqlite_install  # noqa: PLC0415

    directory = Path(tempfile.mkdtemp(prefix="tidemark-demo-"))
    database = directory / "shop.db"
    conn = sqlite3.connect(database, isolation_level=None)
    with contextlib.closing(conn):
        for statement in _SQLITE_SCHEMA:
            conn.execute(statement)
        sqlite_install.install(conn, ["customers", "products", "orders"])
    dsn = f"sqlite://{database}"
    click.echo(f"SQLite file {database}: log tables installed (tidemark logtable install)")
    config_file = _write_simple_pipeline(directory, dsn, "main")
    _run_demo(dsn, config_file, (_SQLITE_ROUND_1, _SQLITE_ROUND_2), "SQLite")
    if keep:
        click.echo(f"kept {directory}")
    else:
        shutil.rmtree(directory, ignore_errors=True)


def _write_simple_pipeline(directory: Path, dsn: str, schema: str) -> Path:
    """The MariaDB and SQLite rounds' pipeline: the shop's targets in *schema*, no slot."""
    targets = "".join(
        f'\n[targets."{schema}.{table.split(".")[1]}"]\npath = "lake/{table.split(".")[1]}"\n'
        f'keys = ["id"]\nstored_as_scd_type = {scd}\n' for table, scd in _TARGETS.items())
    config_file = directory / "pipeline.toml"
    config_file.write_text(
        f'[source]\ndsn = "{dsn}"\n\n[spark]\nmaster = "local[2]"\n'
        'app_name = "tidemark-demo"\ncheckpoint = "checkpoint"\navailable_now = true\n'
        '\n[changelog]\npath = "lake/_changes"\n' + targets, encoding="utf-8")
    return config_file


def _prepare(dsn: str) -> None:
    from tidemark import postgres_connection as pgconn  # noqa: PLC0415
    from tidemark.source.postgres import wal_reads as wal  # noqa: PLC0415

    with contextlib.closing(pgconn.connect(dsn)) as conn, pgconn.cursor(conn) as cur:
        cur.execute(_SCHEMA)
    # The stream starts where the slot is (no initial snapshot yet), so the slot must
    # exist before the first change.
    with contextlib.closing(wal.connect(dsn, purpose="demo")) as replication:
        wal.ensure_slot(replication, _SLOT)


def _write_pipeline(directory: Path, dsn: str) -> Path:
    targets = "".join(
        f'\n[targets."{table}"]\npath = "lake/{table.split(".")[1]}"\nkeys = ["id"]\n'
        f"stored_as_scd_type = {scd}\n" for table, scd in _TARGETS.items())
    text = (f'[source]\ndsn = "{dsn}"\nslot = "{_SLOT}"\npublication = "{_PUBLICATION}"\n'
            "maxChangesPerTrigger = 2000\n\n"
            '[spark]\nmaster = "local[2]"\napp_name = "tidemark-demo"\n'
            'checkpoint = "checkpoint"\navailable_now = true\n'
            '\n[changelog]\npath = "lake/_changes"\n' + targets)
    path = directory / "pipeline.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _execute(dsn: str, statements: list[str]) -> None:
    for statement in statements:
        click.echo(f"  sql> {statement[:90]}{'…' if len(statement) > 90 else ''}")
    if dsn.startswith("sqlite:"):
        from tidemark.source.logtable.sqlite import connect  # noqa: PLC0415

        lite = connect(dsn)
        with contextlib.closing(lite):
            lite.execute("BEGIN")
            for statement in statements:
                lite.execute(statement)
            lite.execute("COMMIT")
        return
    if dsn.startswith("mariadb://"):
        from tidemark.source.mariadb import client  # noqa: PLC0415

        mariadb = client.connect(client.parse_url(dsn))
        with contextlib.closing(mariadb), mariadb.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
        return
    from tidemark import postgres_connection as pgconn  # noqa: PLC0415

    with contextlib.closing(pgconn.connect(dsn)) as conn, pgconn.cursor(conn) as cur:
        for statement in statements:
            cur.execute(statement)


def _run_demo(dsn: str, config_file: Path,
              rounds: tuple[list[str], list[str]] = (_ROUND_1, _ROUND_2),
              database: str = "PostgreSQL") -> None:
    from tidemark.pipeline import BatchReport, format_report, load_config  # noqa: PLC0415
    from tidemark.pipeline.runner import Pipeline, build_session  # noqa: PLC0415

    config = load_config(config_file)
    click.echo(f"pipeline file: {config_file}")
    click.echo("starting Spark (local[2]) …")
    spark = build_session(config)
    totals = {"changes": 0, "seconds": 0.0}

    def show(report: BatchReport) -> None:
        totals["changes"] += report.total
        totals["seconds"] += report.seconds
        click.echo("  " + format_report(report))

    try:
        for number, statements in enumerate(rounds, 1):
            click.echo(f"\nround {number}: changes in {database}")
            _execute(dsn, statements)
            click.echo(f"round {number}: tidemark run {config_file.name} (available_now)")
            Pipeline(config, spark=spark, on_batch=show).run()
    finally:
        spark.stop()
    rate = totals["changes"] / totals["seconds"] if totals["seconds"] else 0.0
    click.echo(f"\napplied {totals['changes']:,} changes in {totals['seconds']:.1f} s "
               f"({rate:,.0f} changes/s, Spark batches incl. Delta commits)")
    _prove(dsn, config, database)
    _verify(config_file)


def _verify(config_file: Path) -> None:
    """``tidemark verify`` on the demo's pipeline: the same proof by checksums."""
    from tidemark.verify import verify  # noqa: PLC0415
    from tidemark.verify.report import text_report  # noqa: PLC0415

    click.echo(f"\ntidemark verify {config_file.name}:")
    result = verify(config_file, wait_s=60.0)
    for line in text_report(result):
        click.echo(f"  {line}")
    if result.exit_code != 0:
        raise DemoMismatchError(f"tidemark verify exited {result.exit_code}")


def _prove(dsn: str, config: Any, database: str = "PostgreSQL") -> None:
    import pyarrow as pa  # noqa: PLC0415
    from deltalake import DeltaTable  # noqa: PLC0415

    from tidemark.lake.delta_read import live_rows  # noqa: PLC0415
    from tidemark.pipeline.compare import compare  # noqa: PLC0415

    click.echo(f"\nDelta tables vs {database}:")
    mismatched = []
    for target in config.targets:
        scd2 = target.spec.stored_as_scd_type == 2
        delta = DeltaTable(target.path)
        columns = [f.name for f in pa.schema(delta.schema().to_arrow())
                   if not f.name.startswith(("_", "__"))]
        source, lake = compare(dsn, target.table, target.path, columns, scd2=scd2)
        same = source == lake
        if not same:
            mismatched.append(target.table)
        versions = live_rows(delta).count_rows()
        history = f", {versions:,} SCD2 versions" if scd2 else ""
        click.echo(f"  {target.table:18} source {len(source):5,} rows | Delta "
                   f"{len(lake):5,} current rows{history} | "
                   f"{'MATCH' if same else 'DIFFERENT'}")
        if target.table.endswith(".customers"):
            _show_rows(columns, source, lake)
        if target.table == "public.products":
            manual = columns.index("manual")
            click.echo("    products.manual after the price update (unchanged TOAST): "
                       + ", ".join(f"id {r[0]}: {len(r[manual] or ''):,} chars"
                                   for r in lake))
    if mismatched:
        raise DemoMismatchError(f"Delta differs from {database} for {', '.join(mismatched)}")
    click.echo(f"\nall Delta tables equal their {database} tables")


def _show_rows(columns: list[str], source: list[Any], lake: list[Any]) -> None:
    shown = [c for c in columns if c != "created"]
    index = [columns.index(c) for c in shown]
    click.echo("    " + " | ".join(f"{c:>17}" for c in shown) + "   (Delta; source)")
    for lake_row, source_row in zip(lake, source, strict=False):
        cells = " | ".join(f"{lake_row[i]!s:>17}" for i in index)
        click.echo(f"    {cells}   {'=' if lake_row == source_row else '≠'}")
