"""The example Spark Declarative Pipeline (``examples/declarative-pipeline``) run by
``tidemark pipelines run`` against a private PostgreSQL: the snapshot and the changes
reach the streaming table, the materialized view and the Delta table kept by
``create_delta_cdc_flow`` equal the source table, and a second run reads only what came
after the first. Its table has a ``timestamptz`` and a ``timestamp`` column, and Spark's
session time zone is not ``UTC`` (delta-rs refused Spark's zone label): the Delta table
holds the same instants."""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from conftest import Database
from delta_rows import live_table
from tidemark.pipeline.compare import compare

pytestmark = [pytest.mark.integration, pytest.mark.slow]

_EXAMPLE = Path(__file__).parents[2] / "examples" / "declarative-pipeline"


_ZONE = "America/New_York"


def _run(project: Path, dsn: str) -> str:
    env = {**os.environ, "TIDEMARK_DSN": dsn, "PYSPARK_PYTHON": sys.executable,
           "TIDEMARK_LAKE": str(project / "lake")}
    done = subprocess.run([sys.executable, "-m", "tidemark", "pipelines", "--conf",
                           "spark.sql.catalogImplementation=hive", "--conf",
                           f"spark.sql.session.timeZone={_ZONE}", "run"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Run is COMPLETED" in output, output[-4000:]
    assert "UNKNOWN_RESPONSE" not in output
    return output


def _table(project: Path, name: str) -> list[dict[str, object]]:
    table = pq.read_table(project / "spark-warehouse" / name)
    # Spark's parquet (INT96) timestamps are UTC instants without a zone.
    at = table.schema.get_field_index("at")
    table = table.set_column(at, "at", table.column(at).cast(pa.timestamp("us", tz="UTC")))
    return table.take(pc.sort_indices(table, [("id", "ascending")])).to_pylist()


def _source(db: Database) -> list[dict[str, object]]:
    return [{"id": i, "item": item, "qty": qty, "at": at, "local": local}
            for i, item, qty, at, local in db.query(
                "SELECT id, item, qty, at, local FROM orders ORDER BY id")]


def _assert_delta_equals_source(project: Path, db: Database) -> None:
    source, lake = compare(db.dsn, "public.orders", str(project / "lake/orders"),
                           ["id", "item", "qty", "at", "local"])
    assert source == lake and len(lake) > 0
    delta = DeltaTable(str(project / "lake/orders"))
    types = {f.name: f.type.type for f in delta.schema().fields}  # type: ignore[attr-defined]
    assert types["at"] == "timestamp" and types["local"] == "timestamp_ntz"
    first = live_table(delta, filter=pc.field("id") == 1).to_pylist()[0]
    assert first["at"] == dt.datetime(2024, 1, 1, 22, 0, tzinfo=dt.UTC) + dt.timedelta(hours=1)
    assert first["local"] == dt.datetime(2024, 1, 2, 1, 0)


def test_the_example_pipeline_keeps_the_view_equal_to_the_source(
        db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE orders (id int PRIMARY KEY, item text, qty int, at timestamptz, "
               "local timestamp)",
               "INSERT INTO orders SELECT g, 'item ' || g, g, "
               "'2024-01-02 00:00+02'::timestamptz + g * interval '1 hour', "
               "'2024-01-02 00:00'::timestamp + g * interval '1 hour' "
               "FROM generate_series(1, 50) g")
    project = tmp_path / "project"
    shutil.copytree(_EXAMPLE, project)
    spec = project / "spark-pipeline.yml"
    spec.write_text(re.sub(r"(?m)^storage: .*$", f"storage: file://{project}/storage",
                           spec.read_text()))

    _run(project, db.dsn)  # the snapshot: the 50 rows
    assert _table(project, "orders") == _source(db)
    _assert_delta_equals_source(project, db)

    db.execute("UPDATE orders SET qty = qty * 10 WHERE id <= 10",
               "DELETE FROM orders WHERE id BETWEEN 41 AND 45",
               "INSERT INTO orders VALUES (100, 'new', 1)")
    db.execute("UPDATE orders SET item = 'again' WHERE id = 1")
    _run(project, db.dsn)  # only the changes since the first run
    assert _table(project, "orders") == _source(db)
    _assert_delta_equals_source(project, db)
    # One Delta commit per micro-batch of the flow, each with its app transaction.
    delta = DeltaTable(str(project / "lake/orders"))
    assert delta.transaction_version("tidemark-cdc-flow-orders_delta") is not None
    changes = pq.read_table(project / "spark-warehouse" / "orders_changes")
    ops = changes.column("_op").to_pylist()
    assert ops.count("r") == 50, "the snapshot was read once, not on the second run"
    assert ops.count("u") == 11 and ops.count("d") == 5 and ops.count("c") == 1
