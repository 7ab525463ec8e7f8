"""``tidemark run`` into merge-on-read targets, killed by SIGKILL inside a batch's
merge-on-read apply (:mod:`tidemark.faults`): the restart leaves the targets equal to
the source, no row twice, and three Delta readers agree.

Each target has several files first (three batches of inserts), then random updates,
deletes and re-inserts spread over all of them, which merge-on-read marks in deletion
vectors; the crash comes in the second batch of those, once the files have vectors.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from conftest import Database
from delta_readers import check_readers_agree
from pipeline_helpers import _assert_equal_to_source, _prepare, _tidemark_run
from tidemark.lake import delta_log
from tidemark.pipeline import load_config
from tidemark.pipeline.runner import Pipeline
from tidemark.testing.postgres import sql_connection

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Rows of a and b each insert transaction brings: one batch each (maxChangesPerTrigger).
_A_ROWS, _B_ROWS = 150, 100
_INSERTS = 3
#: The batch the crash comes in: the second of random changes.
_CRASH = _INSERTS + 1


def _random_changes(db: Database, seed: int, transactions: int) -> None:
    """*transactions* transactions of four random updates, deletes or re-inserts of
    rows of a and b, keys uniform over all rows ever inserted."""
    rng = random.Random(seed)
    with contextlib.closing(sql_connection(db.dsn)) as conn:
        for t in range(transactions):
            with conn.transaction(), conn.cursor() as cur:
                for i in range(4):
                    table, top = rng.choice([("a", _INSERTS * _A_ROWS),
                                             ("b", _INSERTS * _B_ROWS)])
                    key = rng.randint(1, top)
                    op = rng.random()
                    if op < 0.6:
                        cur.execute(f"UPDATE {table} SET v = %s WHERE id = %s",
                                    (f"u{seed}-{t}-{i}", key))
                    elif op < 0.85:
                        cur.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
                    else:
                        cur.execute(f"INSERT INTO {table} (id, v) VALUES (%s, %s) "
                                    "ON CONFLICT (id) DO UPDATE SET v = excluded.v",
                                    (key, f"i{seed}-{t}-{i}"))


def _pipeline(tmp_path: Path, source: str, apply_on: str) -> Path:
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f"[source]\n{source}\n"
        '[spark]\ncheckpoint = "chk"\nmaster = "local[1]"\navailable_now = true\n'
        f'apply_on = "{apply_on}"\n'
        'conf = { "spark.ui.enabled" = "false", "spark.sql.shuffle.partitions" = "1" }\n'
        '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\nsnapshot = "never"\n'
        'merge = "merge_on_read"\n'
        '[targets."public.b"]\npath = "lake/b"\nkeys = ["id"]\nsnapshot = "never"\n'
        'stored_as_scd_type = 2\nmerge = "merge_on_read"\n')
    return file


def _with_vectors(path: Path) -> int:
    """How many of the target's live files have a deletion vector."""
    return sum(1 for add in delta_log.read_log(path).files.values()
               if add.get("deletionVector"))


@pytest.mark.parametrize(("point", "apply_on"), [
    ("mor_after_files", "driver"), ("mor_after_commit", "driver"),
    ("mor_after_files", "executors"), ("mor_after_commit", "executors")])
def test_a_sigkill_inside_a_merge_on_read_batch_then_restart_loses_and_doubles_nothing(
        spark: SparkSession, db: Database, tmp_path: Path, point: str,
        apply_on: str) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))",
               "CREATE TABLE b (id int PRIMARY KEY, v text)")
    source = _prepare(db, "a", "b") + \
        f'dsn = "{db.dsn}"\nmaxChangesPerTrigger = {_A_ROWS + _B_ROWS}\n'
    for i in range(_INSERTS):
        db.execute(f"INSERT INTO a SELECT g, 'x' || g, g / 4.0 FROM generate_series("
                   f"{i * _A_ROWS + 1}, {(i + 1) * _A_ROWS}) g",
                   f"INSERT INTO b SELECT g, 'first' FROM generate_series("
                   f"{i * _B_ROWS + 1}, {(i + 1) * _B_ROWS}) g")
    _random_changes(db, seed=1, transactions=150)  # about 600 changes: batches 3 to 5
    config = _pipeline(tmp_path, source, apply_on)

    log = tmp_path / "run.log"
    proc = _tidemark_run(config, log, extra_env={"TIDEMARK_FAULT": f"{point}:{_CRASH}"})
    assert proc.wait(300) == -signal.SIGKILL, log.read_text(errors="replace")[-3000:]
    # Killed where meant: a (the first target of the batch) has the batch's files
    # and not its commit, or its commit; Spark has not recorded the batch.
    query_id = json.loads((tmp_path / "chk/metadata").read_text().splitlines()[0])["id"]
    lake_a = tmp_path / "lake/a"
    held = DeltaTable(str(lake_a)).transaction_version(f"tidemark-{query_id}-public.a")
    assert held == (_CRASH if point == "mor_after_commit" else _CRASH - 1)
    assert not (tmp_path / "chk/commits" / str(_CRASH)).exists()
    if point == "mor_after_files":
        referenced = set(delta_log.read_log(lake_a).files)
        assert {p.name for p in lake_a.glob("*.parquet")} > referenced

    _random_changes(db, seed=2, transactions=20)  # more after the crash
    Pipeline(load_config(config), spark=spark).run()
    _assert_equal_to_source(db, tmp_path)
    for target in ("a", "b"):
        path = tmp_path / "lake" / target
        assert len(delta_log.read_log(path).files) > 1
        assert _with_vectors(path), f"{target} was not merged on read"
        check_readers_agree(path)
