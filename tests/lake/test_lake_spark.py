"""apply_debezium_dataframe with a real local SparkSession (the shared session fixture)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from lake_helpers import read
from tidemark.lake import ApplySpec, apply_debezium_dataframe, changes_from_debezium_file

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])


def _event(op: str, row: dict[str, object], lsn: int) -> str:
    before, after = (row, None) if op == "d" else (None, row)
    return json.dumps({"before": before, "after": after, "op": op, "transaction": None,
                       "source": {"lsn": lsn, "txId": lsn, "ts_us": lsn,
                                  # [the previous commit's LSN, this change's]
                                  "sequence": json.dumps([str(lsn - 1), str(lsn)])}})


EVENTS = [_event("c", {"id": 1, "name": "a"}, 10), _event("c", {"id": 2, "name": "b"}, 11),
          _event("u", {"id": 1, "name": "A"}, 12), _event("d", {"id": 2, "name": None}, 13)]


def test_a_file_of_capture_lines(tmp_path: Path) -> None:
    lines = [json.dumps({"key": {"id": 1}, "value": json.loads(e)}) for e in EVENTS]
    lines.insert(-1, json.dumps({"key": {"id": 2}, "value": None}))
    (tmp_path / "changes.jsonl").write_text("\n".join(lines) + "\n")
    changes = changes_from_debezium_file(tmp_path / "changes.jsonl", SCHEMA)
    assert changes.column("_op").to_pylist() == ["c", "c", "u", "d"]


@pytest.mark.slow
def test_apply_a_spark_dataframe_of_debezium_json(spark: SparkSession, tmp_path: Path) -> None:
    df = spark.createDataFrame([(e,) for e in EVENTS], "value string")
    result = apply_debezium_dataframe(df, tmp_path / "t", SCHEMA, ApplySpec(keys=("id",)),
                                      app_id="query-1", version=0)
    assert read(tmp_path / "t", "id", "name") == [{"id": 1, "name": "A"}]
    assert result.inserted == 1
