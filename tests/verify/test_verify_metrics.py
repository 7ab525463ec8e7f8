"""The last verify's result, exported by the running pipeline's metrics endpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from conftest import Database
from pipeline_helpers import _LivePipeline, _prepare, scrape, value
from tidemark.pipeline import load_config
from tidemark.verify.run import verify


@pytest.mark.slow
def test_a_running_pipeline_exports_the_rows_verify_found_different(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    source = _prepare(db, "a")
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{db.dsn}"\n{source}[spark]\ncheckpoint = "chk"\n'
                    'master = "local[1]"\ntrigger_interval_ms = 200\n'
                    'conf = { "spark.ui.enabled" = "false", '
                    '"spark.sql.shuffle.partitions" = "1" }\n'
                    '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\n'
                    'snapshot = "never"\n[metrics]\nport = 0\n')
    with _LivePipeline(load_config(file), spark) as live:
        db.execute("INSERT INTO a SELECT g, 'v' || g FROM generate_series(1, 20) g")
        live.applied(20)
        port = live.pipeline.metrics_port
        assert port
        text = scrape(port)
        assert "tidemark_verify_rows_different" not in text, "never verified: no metric"

        # Behind the running pipeline's back: one row deleted, one changed.
        lake = DeltaTable(str(tmp_path / "lake/a"))
        lake.delete("id = 3")
        lake.update({"v": "'zzz'"}, predicate="id = 5")
        result = verify(file, wait_s=60)
        assert result.exit_code == 1, result.as_json()
        assert result.tables[0].phases.keys() >= {"source_sums", "target_sums", "rows",
                                                  "changed_keys", "target_open"}
        assert result.tables[0].rows_fetched > 0
        assert result.phases.keys() == {"snapshot", "wait"}

        text = scrape(port)
        assert value(text, "tidemark_verify_rows_different", table="public.a") == 2
        assert value(text, "tidemark_verify_last_run_timestamp_seconds") == \
            pytest.approx(result.started_at)

        # Mended behind its back again: the next verify's 0 shows at the next scrape.
        db.execute("DELETE FROM a WHERE id IN (3, 5)")
        live.applied(22)
        assert verify(file, wait_s=60).exit_code == 0
        assert value(scrape(port), "tidemark_verify_rows_different", table="public.a") == 0
    assert not live.failures, live.failures
