"""``tidemark-repair`` with a MariaDB source: a tampered target (a row deleted, a value
changed, a row the source lacks added) equals the source again after a repair signal
for those keys, applied in the batch that takes it (real MariaDB, real local Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from conftest import MariaDatabase
from delta_rows import live_table
from tidemark import send_signal
from tidemark.pipeline import load_config
from tidemark.pipeline.progress import BatchReport
from tidemark.pipeline.runner import Pipeline
from tidemark.source.repair_signal import repair_signal_data

pytestmark = pytest.mark.integration


def _lake(tmp_path: Path) -> list[tuple[Any, ...]]:
    rows = live_table(DeltaTable(str(tmp_path / "lake/a"))).to_pylist()
    return sorted((r["id"], r["v"], r["n"]) for r in rows)


def test_a_repair_signal_mends_a_tampered_target(spark: SparkSession, mdb: MariaDatabase,
                                                 tmp_path: Path) -> None:
    mdb.execute("CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(20), n DECIMAL(10,2))",
                "CREATE TABLE dbz_signal (id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT "
                "NULL, data VARCHAR(2048))",
                "INSERT INTO a VALUES " + ",".join(f"({i}, 'v{i}', {i}.5)" for i in range(1, 21)))
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[source]\ndsn = "{mdb.dsn}"\nsignal_table = "{mdb.name}.dbz_signal"\n'
        '[spark]\ncheckpoint = "chk"\navailable_now = true\n'
        f'[targets."{mdb.name}.a"]\npath = "lake/a"\nkeys = ["id"]\n')
    config = load_config(file)
    Pipeline(config, spark=spark).run()

    def source() -> list[tuple[Any, ...]]:
        return sorted(tuple(r) for r in mdb.query("SELECT id, v, n FROM a"))

    assert _lake(tmp_path) == source()
    target = DeltaTable(str(tmp_path / "lake/a"))
    target.delete("id = 3")
    target.update({"v": "'tampered'"}, predicate="id = 5")
    rows = live_table(target)
    extra = rows.filter(pa.compute.equal(rows.column("id"), 7))
    columns = {n: extra.column(n) for n in extra.column_names}
    columns["id"] = pa.array([999], extra.schema.field("id").type)
    write_deltalake(str(tmp_path / "lake/a"), pa.table(columns, schema=extra.schema),
                    mode="append")
    tampered = {r[0]: r for r in _lake(tmp_path)}
    assert _lake(tmp_path) != source()

    mdb.execute("UPDATE a SET v = 'streamed' WHERE id = 8")
    send_signal(mdb.dsn, f"{mdb.name}.dbz_signal", "tidemark-repair",
                repair_signal_data(f"{mdb.name}.a", [{"id": k} for k in (3, 5, 7, 999)]))
    reports: list[BatchReport] = []
    Pipeline(config, spark=spark, on_batch=reports.append).run()
    assert _lake(tmp_path) == source()
    # The stream's change and 3 r + 1 d, in one batch.
    assert [r.total for r in reports if r.total] == [5], reports
    repaired = {r[0]: r for r in _lake(tmp_path)}
    assert {k for k in set(tampered) | set(repaired)
            if tampered.get(k) != repaired.get(k)} == {3, 5, 8, 999}
    reports.clear()
    Pipeline(config, spark=spark, on_batch=reports.append).run()
    assert not [r for r in reports if r.total]  # taken once
