"""Batches too big to collect: spilled by the executors, applied in steps, one commit.

``spark.collect_max_mb = 0`` sends every batch through the spill and ``apply_step_rows``
of a few rows cuts one transaction into many steps, so small tables exercise what a
10M-row bulk load does (``benchmarks/bench_big_transaction.py`` runs that one).
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from conftest import Database
from delta_rows import live_count
from pipeline_helpers import (
    _assert_equal_to_source,
    _batch_lines,
    _pipeline_file,
    _prepare,
    _tidemark_run,
    check_a_snapshot_and_an_empty_table_s_snapshot,
)
from tidemark.lake.branch import BRANCHES_DIR
from tidemark.pipeline import load_config
from tidemark.pipeline.progress import BatchReport
from tidemark.pipeline.runner import Pipeline
from tidemark.pipeline.spill import SPILL_DIR

pytestmark = pytest.mark.integration

_SPILL_EVERYTHING = ('master = "local[1]"\navailable_now = true\ncollect_max_mb = 0\n'
                     'apply_step_rows = 7\nconf = { "spark.ui.enabled" = "false", '
                     '"spark.sql.shuffle.partitions" = "1" }')

#: One transaction touching every key several times: updates, a key change, a delete
#: and a re-insert of the deleted key, an SCD2 key updated and deleted and brought back.
_BIG_TRANSACTION = (
    "UPDATE a SET v = 'first pass'",
    "UPDATE a SET v = 'second pass', n = n + 1 WHERE id % 2 = 0",
    "UPDATE a SET id = 1000 WHERE id = 3",
    "DELETE FROM a WHERE id BETWEEN 10 AND 14",
    "INSERT INTO a VALUES (12, 'back', 0)",
    "INSERT INTO a SELECT g, 'new', g FROM generate_series(100, 140) g",
    "UPDATE b SET v = 'changed' WHERE id <= 10",
    "DELETE FROM b WHERE id = 4",
    "INSERT INTO b VALUES (4, 'returned')",
    "UPDATE b SET v = 'changed twice' WHERE id = 5",
)


def _workload(db: Database) -> None:
    db.execute("INSERT INTO a SELECT g, 'x' || g, g / 4.0 FROM generate_series(1, 60) g",
               "INSERT INTO b SELECT g, 'first' FROM generate_series(1, 20) g")
    db.execute(*_BIG_TRANSACTION)
    db.execute("UPDATE a SET v = 'after' WHERE id = 1", "DELETE FROM b WHERE id = 20")


def _setup(db: Database, tmp_path: Path, *, changelog: bool) -> Path:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))",
               "CREATE TABLE b (id int PRIMARY KEY, v text)")
    source = _prepare(db, "a", "b") + f'dsn = "{db.dsn}"\n'
    _workload(db)
    file = _pipeline_file(tmp_path, source, _SPILL_EVERYTHING, changelog=changelog)
    with file.open("a") as out:  # no upkeep commits: every Delta version is a batch
        out.write("\n[upkeep]\nenabled = false\n")
    return file


@pytest.mark.parametrize("changelog", [False, True], ids=["arrow-rows", "struct-rows"])
def test_a_transaction_of_many_steps_becomes_one_delta_commit_per_target(
        spark: SparkSession, db: Database, tmp_path: Path, changelog: bool) -> None:
    """Every batch is spilled and applied 7 rows at a time; the targets equal the source
    and each batch is one Delta version per target (the first after the one creating
    it), so no reader could see part of a transaction. Both row formats: the change
    log's ``struct`` rows come back from Parquet cast to what Spark collects."""
    config = _setup(db, tmp_path, changelog=changelog)
    reports: list[BatchReport] = []
    Pipeline(load_config(config), spark=spark, on_batch=reports.append).run()

    _assert_equal_to_source(db, tmp_path)
    total = sum(r.total for r in reports)
    assert total > 200, "the workload is many steps of 7 rows"
    for name in ("public.a", "public.b"):
        batches = [r for r in reports if r.changes.get(name)]
        table = DeltaTable(str(tmp_path / "lake" / name.split(".")[1]))
        assert batches and table.version() == len(batches), (
            f"{name}: {table.version()} versions after creating it, for {len(batches)} "
            "batches")
        assert not (tmp_path / "lake" / name.split(".")[1] / BRANCHES_DIR).exists()
    assert not any((tmp_path / "chk" / SPILL_DIR).glob("*/*"))


def test_a_collected_batch_is_applied_in_steps_too(
        spark: SparkSession, db: Database, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A batch under collect_max_mb of log can still hold far more rows (values the
    source compressed): collected, it was merged at once (586 MB of rows in a few MB of
    WAL took the driver to 2.9 GB). It is applied in steps, one commit per batch."""
    import logging  # noqa: PLC0415

    config = _setup(db, tmp_path, changelog=False)
    config.write_text(config.read_text().replace("collect_max_mb = 0\n", ""))
    reports: list[BatchReport] = []
    with caplog.at_level(logging.INFO, logger="tidemark"):
        Pipeline(load_config(config), spark=spark, on_batch=reports.append).run()
    _assert_equal_to_source(db, tmp_path)
    assert "the executors write it" not in caplog.text, "the batches were to be collected"
    assert re.search(r"applied batch \d+ to \S+/lake/a in \d+ steps as one commit",
                     caplog.text), caplog.text[-3000:]
    for name in "ab":
        batches = [r for r in reports if r.changes.get(f"public.{name}")]
        assert DeltaTable(str(tmp_path / "lake" / name)).version() == len(batches)


@pytest.mark.slow
def test_sigkill_between_steps_then_restart_loses_and_doubles_nothing(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    """A SIGKILL while batch 0 is half merged into a branch: the target shows none of
    it; the restart removes the branch, replays the batch and the targets equal the
    source."""
    config = _setup(db, tmp_path, changelog=False)
    log = tmp_path / "run.log"
    proc = _tidemark_run(config, log, extra_env={"TIDEMARK_FAULT": "between_steps:0"})
    assert proc.wait(180) == -signal.SIGKILL, log.read_text(errors="replace")[-3000:]
    assert _batch_lines(log) == []
    killed_in = [t for t in "ab" if (tmp_path / "lake" / t / BRANCHES_DIR).exists()]
    assert killed_in == ["a"], "the kill came while a's steps went into its branch"
    # The target was created before the steps, and holds nothing of the batch.
    assert live_count(DeltaTable(str(tmp_path / "lake/a"))) == 0

    reports: list[BatchReport] = []
    Pipeline(load_config(config), spark=spark, on_batch=reports.append).run()
    assert reports and reports[0].batch_id == 0 and not reports[0].replayed
    _assert_equal_to_source(db, tmp_path)
    assert not (tmp_path / "lake/a" / BRANCHES_DIR).exists()


def test_a_snapshot_and_an_empty_table_s_snapshot_through_the_spill(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    """Snapshot chunks come through the spill too (loads write their pieces into a
    branch, committed once), and an empty table's snapshot still creates its target."""
    check_a_snapshot_and_an_empty_table_s_snapshot(spark, db, tmp_path, _SPILL_EVERYTHING)


def test_snapshot_batches_are_spilled_and_loaded_in_steps_whatever_the_log_says(
        spark: SparkSession, db: Database, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A batch of snapshot chunks spans next to no WAL, yet holds snapshotChunkRows rows
    a chunk, of any width: it was collected whole, and its rows put together on the
    driver. Every such batch is spilled, and loaded a step at a time as one commit."""
    import logging  # noqa: PLC0415

    from tidemark.pipeline.compare import compare  # noqa: PLC0415

    db.execute("CREATE TABLE c (id int PRIMARY KEY, v text)",
               "INSERT INTO c SELECT g, 'row ' || g FROM generate_series(1, 35) g")
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{db.dsn}"\nslot = "s_{db.name}"\n'
                    f'publication = "p_{db.name}"\nsnapshotChunkRows = 10\n'
                    "snapshotChunksPerTrigger = 1\n[spark]\ncheckpoint = \"chk\"\n"
                    'available_now = true\napply_step_rows = 4\n'
                    'conf = { "spark.ui.enabled" = "false" }\n'
                    '[targets."public.c"]\npath = "lake/c"\nkeys = ["id"]\n')
    with caplog.at_level(logging.INFO, logger="tidemark"):
        Pipeline(load_config(file), spark=spark).run()
    source, lake = compare(db.dsn, "public.c", str(tmp_path / "lake/c"), ["id", "v"])
    assert source == lake and len(lake) == 35
    spilled = {int(m) for m in re.findall(r"batch (\d+) spans an unknown amount", caplog.text)}
    loaded = {int(m) for m in re.findall(r"loaded batch (\d+) into \S+ in 3 steps",
                                         caplog.text)}
    # Chunks of 10 rows, one a batch, in steps of 4: batches 0 to 2 in 3 steps each.
    assert loaded == {0, 1, 2} and loaded <= spilled, caplog.text[-3000:]


def test_the_spill_cuts_row_groups_by_bytes_after_a_small_first_row(
        spark: SparkSession, tmp_path: Path) -> None:
    """Parquet's writer sizes its row group every so many rows, guessed from the rows so
    far: after a small first row it waited 1,000 rows, and a spill of 1 MB rows became
    one row group held whole in the executor's heap (a 1 GB transaction overflowed a
    512 MB heap). Row groups stay near parquet.block.size (32 MB) whatever comes first."""
    from pyspark.sql import functions as fn  # noqa: PLC0415

    from tidemark.pipeline import spill  # noqa: PLC0415

    rows = spark.range(0, 160, 1, 1).select(
        fn.col("id"), fn.when(fn.col("id") == 0, fn.lit(b"x")).otherwise(
            fn.expr("cast(randstr(1048576, 7) as binary)")).alias("blob"))
    path = tmp_path / SPILL_DIR / "0"
    spill.spill(rows, path)
    groups = [(meta.row_group(i).num_rows, meta.row_group(i).total_byte_size)
              for file in path.glob("part-*.parquet")
              for meta in [pq.ParquetFile(file).metadata]
              for i in range(meta.num_row_groups)]
    assert sum(n for n, _ in groups) == 160
    assert max(size for _, size in groups) <= 48 << 20, [size >> 20 for _, size in groups]
