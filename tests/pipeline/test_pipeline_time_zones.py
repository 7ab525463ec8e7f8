"""``tidemark run`` under a Spark session time zone that is not ``UTC``: the Delta target
gets a ``timestamptz`` column's instants as Delta's ``timestamp`` and a ``timestamp``
column as ``timestamp_ntz``, the values the source holds (delta-rs refuses a timestamp
labelled with any zone but ``UTC``, which is how Spark hands over its session's)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from conftest import Database
from delta_rows import live_table
from pipeline_helpers import _prepare
from tidemark.pipeline.compare import compare
from tidemark.pipeline.config import load_config
from tidemark.pipeline.runner import Pipeline

pytestmark = pytest.mark.integration


@pytest.fixture(params=["Etc/UTC", "America/New_York"])
def session_zone(request: pytest.FixtureRequest, spark: SparkSession) -> Iterator[str]:
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", request.param)
    try:
        yield request.param
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


def test_timestamps_reach_delta_as_the_source_s_instants(
        spark: SparkSession, session_zone: str, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, at timestamptz, local timestamp)")
    source = _prepare(db, "a") + f'dsn = "{db.dsn}"\n'
    db.execute("INSERT INTO a VALUES (1, '2024-01-02 03:04:05.123456+02', "
               "'2024-01-02 03:04:05.123456'), (2, NULL, NULL)")
    db.execute("UPDATE a SET at = at + interval '1 day' WHERE id = 1")
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\n{source}\n[spark]\ncheckpoint = "chk"\navailable_now = true\n'
                    '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\n'
                    'snapshot = "never"\n')
    Pipeline(load_config(file), spark=spark).run()

    target = str(tmp_path / "lake/a")
    source_rows, lake = compare(db.dsn, "public.a", target, ["id", "at", "local"])
    assert source_rows == lake and len(lake) == 2
    delta = DeltaTable(target)
    types = {f.name: f.type.type for f in delta.schema().fields}  # type: ignore[attr-defined]
    assert types["at"] == "timestamp" and types["local"] == "timestamp_ntz"
    first = live_table(delta, filter=pc.field("id") == 1).to_pylist()[0]
    assert first["at"] == dt.datetime(2024, 1, 3, 1, 4, 5, 123456, tzinfo=dt.UTC)
    assert first["local"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456)
