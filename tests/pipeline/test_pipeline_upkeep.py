"""``tidemark run`` keeps its targets healthy between batches: many small insert batches
leave few files and a checkpoint, the batch lines and ``tidemark status`` say what ran,
and the target still equals the source."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from conftest import Database
from pipeline_helpers import _prepare
from tidemark.cli.status import pipeline_status
from tidemark.pipeline import load_config
from tidemark.pipeline.compare import compare
from tidemark.pipeline.progress import BatchReport, format_report
from tidemark.pipeline.runner import Pipeline

pytestmark = pytest.mark.integration


def test_many_small_batches_leave_few_files_a_checkpoint_and_the_source_s_rows(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))")
    source = _prepare(db, "a") + f'dsn = "{db.dsn}"\nmaxChangesPerTrigger = 3\n'
    for t in range(30):
        db.execute(f"INSERT INTO a SELECT g, 'v' || g, g FROM generate_series({3 * t + 1}, "
                   f"{3 * t + 3}) g")
    db.execute("UPDATE a SET v = 'late' WHERE id % 10 = 0")
    file = tmp_path / "pipeline.toml"
    file.write_text(f"[source]\n{source}\n[spark]\ncheckpoint = \"chk\"\navailable_now = true\n"
                    'master = "local[1]"\nconf = { "spark.ui.enabled" = "false" }\n'
                    "[upkeep]\ncompact_min_files = 4\ncheckpoint_every = 5\n"
                    "vacuum_every_minutes = 0\n"
                    '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\n'
                    'snapshot = "never"\n')
    reports: list[BatchReport] = []
    Pipeline(load_config(file), spark=spark, on_batch=reports.append).run()

    assert len([r for r in reports if r.total]) >= 20, "small batches, a file each"
    tasks = {task for r in reports for _, task, _ in r.upkeep}
    assert {"compact", "checkpoint"} <= tasks
    line = next(format_report(r) for r in reports if any(t == "compact" for _, t, _ in r.upkeep))
    assert "| merge public.a copy_on_write | upkeep public.a: compacted " in line
    table = DeltaTable(str(tmp_path / "lake/a"))
    assert len(table.file_uris()) <= 4
    assert (tmp_path / "lake/a/_delta_log/_last_checkpoint").exists()
    source_rows, lake_rows = compare(db.dsn, "public.a", str(tmp_path / "lake/a"),
                                     ["id", "v", "n"])
    assert source_rows == lake_rows and len(lake_rows) == 90

    status = pipeline_status(load_config(file), str(file))
    (target,) = status["targets"]
    assert target["files"] == len(table.file_uris())
    assert target["checkpoint_version"] is not None
    upkeep = status["last_run"]["upkeep"]
    assert "public.a compact" in upkeep and "compacted" in upkeep["public.a compact"]


def test_the_batch_line_says_how_each_target_was_merged() -> None:
    report = BatchReport(batch_id=3, changes={"public.a": 120, "public.b": 4}, seconds=1.0,
                         lag_bytes=0, lag_seconds=0.4,
                         merges=(("public.a", "merge_on_read"), ("public.b", "copy_on_write")))
    line = format_report(report)
    # What the pipeline tests parse stays where it was.
    assert line.startswith("batch 3: public.a +120, public.b +4 | 124 changes/s | lag 0 B")
    assert line.endswith("| merge public.a merge_on_read, public.b copy_on_write")
    assert "| merge" not in format_report(dataclasses.replace(report, merges=()))
