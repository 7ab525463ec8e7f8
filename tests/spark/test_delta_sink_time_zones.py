"""The ``tidemark-delta`` sink (what ``create_delta_cdc_flow`` declares) and Spark's
session time zone: Spark hands the sink timestamps labelled with the session's zone
(``Etc/UTC``, ``America/New_York``), which delta-rs refuses unless labelled ``UTC``. The
Delta table gets the same instants in Delta's ``timestamp`` (UTC-adjusted), and a
timestamp without time zone stays one (``timestamp_ntz``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

import tidemark.spark as ts
from conftest import Database
from delta_rows import live_table

pytestmark = pytest.mark.integration


@pytest.fixture(params=["Etc/UTC", "America/New_York"])
def session_zone(request: pytest.FixtureRequest, spark: SparkSession) -> Iterator[str]:
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", request.param)
    try:
        yield request.param
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


def test_timestamps_reach_delta_as_the_same_instants(
        spark: SparkSession, session_zone: str, db: Database, tmp_path: Path) -> None:
    db.execute("SET TIME ZONE 'Asia/Tokyo'",
               "CREATE TABLE t (id int PRIMARY KEY, at timestamptz, local timestamp)",
               "INSERT INTO t VALUES (1, '2024-01-02 03:04:05.123456+02', "
               "'2024-01-02 03:04:05.123456'), (2, NULL, NULL)")
    stream = ts.read_table(spark, dsn=db.dsn, table="public.t", slot=f"s_{db.name}",
                           publication=f"p_{db.name}", snapshot="initial")
    target = tmp_path / "lake" / "t"
    query = (stream.writeStream.format("tidemark-delta").option("path", str(target))
             .option("keys", "id").option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120), "Trigger.AvailableNow did not stop"
    assert query.exception() is None, query.exception()

    delta = DeltaTable(str(target))
    types = {f.name: f.type.type for f in delta.schema().fields}  # type: ignore[attr-defined]
    assert types["at"] == "timestamp" and types["local"] == "timestamp_ntz"
    table = live_table(delta).sort_by("id")
    assert str(table.schema.field("at").type.tz) in ("UTC", "+00:00")
    assert table.schema.field("local").type.tz is None
    rows = table.select(["id", "at", "local"]).to_pylist()
    assert rows[0]["at"] == dt.datetime(2024, 1, 2, 1, 4, 5, 123456, tzinfo=dt.UTC)
    assert rows[0]["local"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456)
    assert rows[1]["at"] is None and rows[1]["local"] is None
