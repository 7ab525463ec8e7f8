"""tidemark verify against a running pipeline (`tidemark run`, 200 ms trigger) while a
writer keeps changing the source: inserts, updates, deletes, key changes, transactions
of many rows, and three hot keys of every table updated in every transaction.

Every verify during the writes finds the SCD1, SCD2 and soft-delete targets equal;
the keys changed after a round's position are compared in later rounds, and the hot
keys end as "not compared", never as differences. A target changed behind the
pipeline's back (a row deleted, one changed, one added, on keys the writer leaves
alone) is named row by row; a killed pipeline is not waited for, its lag reported as
"target behind", and once restarted under the writer only the drift is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable, write_deltalake

from conftest import Database
from pipeline_helpers import _tidemark_run
from tidemark.cli.main import cli
from tidemark.run_record import read_record
from tidemark.testing.postgres import PostgresCluster, sql_connection
from tidemark.verify.result import VerifyResult
from tidemark.verify.run import ROUNDS, verify
from waiting import wait_for

pytestmark = pytest.mark.slow

ROWS = 3000
HOT = (1, 2, 3)
#: The writer's keys among the first rows; the rest (and every id from 100,000 up that
#: it inserts) are its own too. Keys DRIFT_* are never touched by it.
WRITER_KEYS = (4, 2800)
DRIFT_DELETED, DRIFT_CHANGED, DRIFT_ADDED = 2950, 2960, 5_000_000
TABLES = ("public.a", "public.b", "public.c")
VERIFIES = 4


class _Writer(threading.Thread):
    """Transactions until stopped, paced to about *rows_per_s* changed rows: each
    updates the hot keys of a, b and c, then a few single-row changes (insert, upsert,
    update, delete, key change) or, one in twenty, an update of 150 rows."""

    def __init__(self, dsn: str, seed: int, rows_per_s: float = 2000) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.rows_per_s = rows_per_s
        self.rows = 0
        self.transactions = 0
        self.key_changes = 0
        self.error: BaseException | None = None
        self._next_id = 100_000
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            started = time.monotonic()
            with contextlib.closing(sql_connection(self.dsn)) as conn:
                while not self._halt.is_set():
                    with conn.transaction(), conn.cursor() as cur:
                        self._transaction(cur)
                    self.transactions += 1
                    ahead = self.rows / self.rows_per_s - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)  # pacing the writer, not waiting for a condition
        except BaseException as err:  # reported by finish()
            self.error = err

    def _transaction(self, cur: Any) -> None:
        rng = self.rng
        for table in "abc":
            cur.execute(f"UPDATE {table} SET n = n + 1 WHERE id IN (1, 2, 3)")
            self.rows += cur.rowcount
        table = rng.choice("aabc")
        if rng.random() < 0.05:
            low = rng.randint(*WRITER_KEYS)
            cur.execute(f"UPDATE {table} SET v = md5(random()::text) "
                        "WHERE id BETWEEN %s AND %s", (low, low + 149))
            self.rows += cur.rowcount
            return
        for _ in range(rng.randint(1, 6)):
            self._change(cur, table, rng)

    def _change(self, cur: Any, table: str, rng: random.Random) -> None:
        op = rng.random()
        key = rng.randint(*WRITER_KEYS) if rng.random() < 0.8 else \
            rng.randint(100_000, self._next_id)
        if op < 0.25:
            self._next_id += 1
            cur.execute(f"INSERT INTO {table} VALUES (%s, %s, 0)",
                        (self._next_id, f"new {self._next_id}"))
        elif op < 0.45:
            cur.execute(f"INSERT INTO {table} VALUES (%s, %s, 0) ON CONFLICT (id) "
                        "DO UPDATE SET v = excluded.v", (key, f"up {rng.random()}"))
        elif op < 0.75:
            cur.execute(f"UPDATE {table} SET v = %s, n = n - 1 WHERE id = %s",
                        (f"set {rng.random()}", key))
        elif op < 0.9:
            cur.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
        else:
            self._next_id += 1
            cur.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (self._next_id, key))
            self.key_changes += cur.rowcount
        self.rows += cur.rowcount

    def finish(self) -> None:
        self._halt.set()
        self.join(30)
        assert not self.is_alive(), "the writer did not stop"
        if self.error is not None:
            raise self.error


@dataclass
class _Live:
    db: Database
    config: Path
    log: Path
    writer: _Writer
    proc: subprocess.Popen[bytes]

    def running(self) -> None:
        """Fail if the pipeline or (once started) the writer has stopped."""
        assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
        assert self.writer.ident is None or self.writer.is_alive(), self.writer.error

    def start(self) -> None:
        self.proc = _tidemark_run(self.config, self.log)

    def stop(self, signum: int) -> None:
        os.killpg(self.proc.pid, signum)
        self.proc.wait(120)


@pytest.fixture(scope="module")
def live(pg_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[_Live]:
    """A 3,000-row table a (SCD1), b (SCD2) and c (soft delete), loaded by `tidemark
    run`'s snapshot; then the writer starts and the pipeline runs on."""
    name = "live_verify"
    pg_cluster.create_database(name)
    db = Database(pg_cluster, name)
    tmp = tmp_path_factory.mktemp("live")
    db.execute(*(f"CREATE TABLE {t} (id int PRIMARY KEY, v text, n bigint)" for t in "abc"),
               *(f"INSERT INTO {t} SELECT g, 'v' || g, g FROM generate_series(1, {ROWS}) g"
                 for t in "abc"))
    config = tmp / "pipeline.toml"
    config.write_text(
        f'[source]\ndsn = "{db.dsn}"\nslot = "s_live"\npublication = "p_live"\n'
        '[spark]\ncheckpoint = "chk"\nmaster = "local[2]"\ntrigger_interval_ms = 200\n'
        'conf = { "spark.ui.enabled" = "false", "spark.sql.shuffle.partitions" = "2" }\n'
        '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\n'
        '[targets."public.b"]\npath = "lake/b"\nkeys = ["id"]\nstored_as_scd_type = 2\n'
        '[targets."public.c"]\npath = "lake/c"\nkeys = ["id"]\n'
        'soft_delete_column = "_deleted"\n')
    log = tmp / "run.log"
    writer = _Writer(db.dsn, seed=38)
    state = _Live(db, config, log, writer, _tidemark_run(config, log))
    try:
        _first_batch(state)
        writer.start()
        yield state
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(state.proc.pid, signal.SIGKILL)
        state.proc.wait(60)
        if writer.ident is not None:
            writer.finish()
        with contextlib.suppress(Exception):
            db.autocommit("SELECT pg_drop_replication_slot('s_live')")
        pg_cluster.drop_database(name)


def _first_batch(live: _Live) -> None:
    """Wait until the pipeline has applied a batch (its snapshot's, on a loaded
    machine this can take minutes: Spark starts first)."""
    def applied() -> bool:
        live.running()
        return any(line.startswith("batch ") and "no changes" not in line
                   for line in live.log.read_text(errors="replace").splitlines())
    wait_for(applied, 300, "the pipeline's first batch")


def _restart(live: _Live) -> None:
    """Start the pipeline again and wait until its run record names the new process.
    Spark on a loaded machine sometimes fails its first job with "Python worker failed
    to connect back" (a worker slower to start than Spark waits for): started again."""
    checkpoint = str(live.config.parent / "chk")
    for _ in range(3):
        live.start()
        wait_for(lambda: live.proc.poll() is not None or (
            (record := read_record(checkpoint)) is not None and record.pid == live.proc.pid
            and any(line.startswith("batch ") for line in
                    live.log.read_text(errors="replace").splitlines()[-3:])), 300,
                 "the restarted run's record and a batch")
        if live.proc.poll() is None:
            return
        text = live.log.read_text(errors="replace")
        assert "Python worker failed to connect back" in text[-5000:], text[-3000:]
    pytest.fail("the pipeline did not restart: " + live.log.read_text()[-3000:])


def _verify(live: _Live) -> VerifyResult:
    result = verify(live.config, wait_s=90)
    assert result.error is None, result.error
    return result


def test_every_verify_under_the_writer_is_equal(live: _Live) -> None:
    hot = [{"id": str(k)} for k in HOT]
    recompared = 0
    for number in range(VERIFIES):
        before = live.writer.rows
        result = _verify(live)
        live.running()
        assert live.writer.rows > before, "the writer wrote nothing during the verify"
        for table in result.tables:
            where = f"verify {number + 1}, {table.table}"
            assert table.differences == [], (where, table.differences[:10])
            assert not table.target_behind, where
            assert table.rows_compared > ROWS / 2, where
            # The hot keys change in every round: each is never compared, and never
            # taken for a difference.
            assert table.rounds == ROUNDS, where
            assert [k for k in hot if k in table.not_compared] == hot, where
            assert table.keys_not_compared >= len(HOT), where
            rounds = table.round_results
            assert [r.number for r in rounds] == list(range(1, ROUNDS + 1)), where
            assert all(r.keys_changed >= len(HOT) for r in rounds), (where, rounds)
            assert rounds[0].keys_recompared == 0
            assert sum(r.rows_compared for r in rounds) == table.rows_compared
            recompared += sum(r.keys_recompared for r in rounds[1:])
    # Keys changed during a round were compared in a later one.
    assert recompared > 0
    assert live.writer.key_changes > 0
    assert live.writer.transactions > 100


def test_a_killed_pipeline_and_a_target_changed_behind_its_back(live: _Live) -> None:
    # Killed: its run record still says running. The writer runs on, so the target
    # falls behind; and the target is changed behind the pipeline's back (with the
    # pipeline down: its own Delta commits would race these), on keys the writer
    # never touches.
    live.stop(signal.SIGKILL)
    rows = live.writer.rows
    path = str(live.config.parent / "lake/a")
    table = DeltaTable(path)
    table.delete(f"id = {DRIFT_DELETED}")
    table.update({"v": "'zzz'"}, predicate=f"id = {DRIFT_CHANGED}")
    schema = pa.schema(DeltaTable(path).schema().to_arrow())
    write_deltalake(path, pa.Table.from_pylist(
        [{"id": DRIFT_ADDED, "v": "not in the source", "n": 0, "_commit_lsn": 0,
          "_seq": 0}], schema), mode="append")
    wait_for(lambda: live.writer.rows > rows + 500 or live.writer.error, 30,
             "changes the killed pipeline does not apply")
    drift = [("different", {"id": str(DRIFT_CHANGED)}, ("v",)),
             ("extra", {"id": str(DRIFT_ADDED)}, ()),
             ("missing", {"id": str(DRIFT_DELETED)}, ())]

    # Not waited for (--wait 600), compared as it is: the lag and the drift, all
    # marked target behind.
    out = CliRunner().invoke(cli, ["verify", str(live.config), "--json", "--wait", "600"],
                             standalone_mode=False)
    assert isinstance(out.exception, SystemExit) and out.exception.code == 1, out.output
    report = json.loads(out.stdout)
    assert report["seconds"] < 600, "waited out --wait for a pipeline that is dead"
    for table_report in report["tables"]:
        assert table_report["target_behind"], table_report["table"]
        assert table_report["round_results"][0]["target_behind"]
        assert all(d["target_behind"] for d in table_report["differences"])
    a_found = {(d["kind"], d["key"]["id"]) for d in report["tables"][0]["differences"]}
    assert {(kind, key["id"]) for kind, key, _ in drift} <= a_found
    assert len(a_found) > len(drift), "the writer's changes since the kill"

    # Restarted, the pipeline catches up under the writer: exactly the drift is left.
    # (Verify knows the run is alive once the new process has recorded its start.)
    _restart(live)
    result = _verify(live)
    live.running()
    found = {t.table: t for t in result.tables}
    assert [(d.kind, d.key, d.columns, d.target_behind)
            for d in found["public.a"].differences] == [(*d, False) for d in drift]
    assert found["public.b"].differences == [] and found["public.c"].differences == []
    assert not any(t.target_behind for t in result.tables)
    assert result.exit_code == 1
