"""``tidemark status`` on a real PostgreSQL: a capture's slot and offsets, a pipeline's
Delta targets, Spark checkpoint and slot, and the exit status (0 healthy, 1 something is
wrong, 2 the status could not be taken).

The command runs as a subprocess (``python -m tidemark``), as users run it: the exit
status and the ``error:`` line come from the CLI's entry point. The pipeline tests build
a checkpoint in Spark's own file format (copied from one ``tidemark run`` wrote) beside
Delta tables written by ``apply_changes``, so they need no Spark; one slow test runs a
real ``tidemark run --available-now`` first.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import Database
from lake_helpers import change, rows
from tidemark.cli.status import pipeline_facts
from tidemark.lake import ApplySpec, apply_changes
from tidemark.lake.written_targets import WrittenTargets
from tidemark.pipeline.config import load_config
from tidemark.run_record import FILE_NAME, read_record, records_runs
from tidemark.source.postgres.pgoutput import lsn_to_str, str_to_lsn
from tidemark.source.postgres.snapshot_plan import SnapshotPlan
from tidemark.source.postgres.stream_offsets import SourceOffset
from tidemark.status.postgres_pipeline import snapshot_section

pytestmark = pytest.mark.integration

QUERY_ID = "34bbe9f5-0328-43ea-ac33-862ed1f2dff6"


def _tidemark(*args: str, env: dict[str, str] | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "TIDEMARK_DSN"}
    return subprocess.run([sys.executable, "-m", "tidemark", *args], env={**environ,
                          **(env or {})}, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _status(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    done = _tidemark("status", "--json", *args, env=env)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def _capture(db: Database, slot: str, offsets: Path) -> None:
    done = _tidemark("capture", "--dsn", db.dsn, "--table", "public.a", "--slot", slot,
                     "--publication", f"p_{slot}", "--stop-at-end", "--offsets",
                     str(offsets))
    assert done.returncode == 0, done.stderr


# -- a capture ---------------------------------------------------------------------------

def test_capture_status_shows_slot_positions_and_the_lag_grows_with_writes(
        db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)",
               "INSERT INTO a SELECT g, 'x' FROM generate_series(1, 10) g")
    offsets = tmp_path / "offsets.json"
    _capture(db, "cap", offsets)
    saved = json.loads(offsets.read_text())[f"postgres/{db.name}/cap"]

    code, status = _status("--dsn", db.dsn, "--slot", "cap", "--offsets", str(offsets))
    assert code == 0 and status["healthy"] and status["problems"] == []
    assert status["kind"] == "capture"
    slot = status["slot"]
    assert slot["exists"] and slot["plugin"] == "pgoutput" and slot["type"] == "logical"
    assert slot["database"] == status["server"]["database"] == db.name
    assert slot["active"] is False and slot["active_pid"] is None
    confirmed = str_to_lsn(slot["confirmed_flush_lsn"])
    assert confirmed == int(db.scalar("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM "
                                      "pg_replication_slots WHERE slot_name = 'cap'"))
    server = str_to_lsn(status["server"]["current_lsn"])
    assert status["lag"]["from"] == "slot" and status["lag"]["bytes"] == server - confirmed >= 0
    assert slot["wal_retained_bytes"] == server - str_to_lsn(slot["restart_lsn"]) >= 0
    assert slot["wal_status"] == "reserved"
    # The capture saved its offset, then confirmed the slot there.
    assert status["offsets"]["lsn"] == lsn_to_str(saved["lsn"])
    assert status["offsets"]["state"] == "in_step" and status["offsets"]["bytes_vs_slot"] == 0
    assert status["snapshot"]["completed"] is True and status["snapshot"]["source"] == "offsets"

    db.execute("INSERT INTO a SELECT g, repeat('y', 200) FROM generate_series(11, 2000) g")
    code, later = _status("--dsn", db.dsn, "--slot", "cap", "--offsets", str(offsets))
    assert code == 0
    assert later["slot"]["confirmed_flush_lsn"] == slot["confirmed_flush_lsn"]
    assert later["lag"]["bytes"] > status["lag"]["bytes"] + 100_000
    assert later["slot"]["wal_retained_bytes"] > slot["wal_retained_bytes"]
    # Nobody streams from the slot: its lag in time was not measured, and says so.
    assert later["lag"]["seconds"] is None and later["lag"]["seconds_source"] is None
    assert "no process is streaming" in later["lag"]["note"]

    text = _tidemark("status", "--slot", "cap", "--offsets", str(offsets),
                     env={"TIDEMARK_DSN": db.dsn})
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"capture slot cap (database {db.name}): OK")
    assert "unknown seconds" in text.stdout
    assert "the slot is confirmed exactly up to the saved offset" in text.stdout


def test_a_running_capture_shows_its_walsender(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    env = {**os.environ, "TIDEMARK_DSN": db.dsn}
    proc = subprocess.Popen([sys.executable, "-m", "tidemark", "capture", "--table",
                             "public.a", "--slot", "live", "--publication", "p_live"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        active = db.settled_scalar("SELECT coalesce(bool_or(active), false) FROM "
                                   "pg_replication_slots WHERE slot_name = 'live'", True,
                                   timeout_s=30)
        assert active, proc.stderr.read() if proc.poll() is not None else "not active"
        db.execute("INSERT INTO a SELECT g, 'x' FROM generate_series(1, 100) g")
        code, status = _status("--dsn", db.dsn, "--slot", "live")
        assert code == 0, status["problems"]
        slot = status["slot"]
        assert slot["active"] and slot["active_pid"] is not None
        assert slot["holder_backend_type"] == "walsender"
        assert slot["holder_application"] == "tidemark"
        lag = status["lag"]
        # Measured by the server, or unknown with the reason; never made up.
        if lag["seconds"] is None:
            assert lag["seconds_source"] is None and "walsender" in lag["note"]
        else:
            assert lag["seconds"] >= 0 and lag["seconds_source"] in (
                "walsender_flush_lag", "walsender_replay_lag", "walsender_write_lag",
                "caught_up")
        assert status["offsets"] is None and status["snapshot"]["completed"] is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_missing_slot_is_exit_1_with_a_clear_message(db: Database) -> None:
    code, status = _status("--dsn", db.dsn, "--slot", "nowhere")
    assert code == 1 and not status["healthy"]
    assert status["problems"] == ["replication slot 'nowhere' does not exist on this server"]
    assert status["slot"]["exists"] is False and status["slot"]["confirmed_flush_lsn"] is None
    assert status["lag"]["bytes"] is None
    text = _tidemark("status", "--dsn", db.dsn, "--slot", "nowhere")
    assert text.returncode == 1
    assert "PROBLEM" in text.stdout.splitlines()[0]
    assert "replication slot 'nowhere' does not exist" in text.stdout


def test_offsets_against_the_slot_and_the_server(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    offsets = tmp_path / "offsets.json"
    _capture(db, "off", offsets)
    key = f"postgres/{db.name}/off"
    confirmed = int(json.loads(offsets.read_text())[key]["lsn"])

    def with_offset(offset: object) -> tuple[int, dict[str, Any]]:
        offsets.write_text(json.dumps({key: offset, "other/key": {"lsn": 1}}))
        return _status("--dsn", db.dsn, "--slot", "off", "--offsets", str(offsets))

    # Behind the slot: offsets are saved before the slot is confirmed, so this slot was
    # made again after they were saved; a capture would refuse it.
    code, status = with_offset({"lsn": confirmed - 16, "snapshot_completed": True})
    assert code == 1 and status["offsets"]["state"] == "behind_slot"
    assert status["offsets"]["bytes_vs_slot"] == -16
    assert "made again" in status["offsets"]["meaning"]
    assert any("'off'" in p and "never streamed" in p for p in status["problems"])
    assert status["offsets"]["keys"] == ["other/key", key]

    # Ahead of the slot but not of the server: saved, not yet confirmed.
    db.execute("INSERT INTO a VALUES (1, 'x')")
    code, status = with_offset({"lsn": confirmed + 8, "snapshot_completed": False})
    assert code == 0 and status["offsets"]["state"] == "ahead_of_slot"
    assert status["snapshot"]["completed"] is False
    assert "takes it again" in status["snapshot"]["note"]

    # Ahead of the server's WAL: another server's offset, or edited.
    code, status = with_offset({"lsn": 1 << 62, "snapshot_completed": True})
    assert code == 1 and status["offsets"]["state"] == "ahead_of_server"
    assert "ahead of this server's WAL" in status["problems"][0]

    code, status = with_offset({"lsn": "0/1"})
    assert code == 1 and status["offsets"]["state"] == "invalid"

    offsets.write_text(json.dumps({"other/key": {"lsn": 1}}))
    code, status = _status("--dsn", db.dsn, "--slot", "off", "--offsets", str(offsets))
    assert code == 0 and status["offsets"]["state"] == "no_key"
    assert status["warnings"] and key in status["warnings"][0]

    offsets.unlink()
    code, status = _status("--dsn", db.dsn, "--slot", "off", "--offsets", str(offsets))
    assert code == 0 and status["offsets"]["state"] == "no_file"


def test_usage_and_connection_errors_are_exit_2(db: Database, tmp_path: Path) -> None:
    done = _tidemark("status")
    assert done.returncode == 2 and "give --dsn" in done.stderr
    config = _pipeline_file(tmp_path, db, "s")
    done = _tidemark("status", str(config), "--slot", "x")
    assert done.returncode == 2 and "--slot is for a capture's status" in done.stderr
    (tmp_path / "bad.toml").write_text("[source]\nslott = 1\n")
    done = _tidemark("status", str(tmp_path / "bad.toml"))
    assert done.returncode == 2 and done.stderr.startswith("error: source.slott: unknown")
    done = _tidemark("status", "--dsn", "host=127.0.0.1 port=1 dbname=x connect_timeout=2")
    assert done.returncode == 2 and done.stderr.startswith("error: cannot connect")
    assert done.stdout == ""


# -- a pipeline, without Spark -----------------------------------------------------------

def _pipeline_file(tmp_path: Path, db: Database, slot: str) -> Path:
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{db.dsn}"\nslot = "{slot}"\npublication = "p_{slot}"\n'
                    '[spark]\ncheckpoint = "chk"\n'
                    '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\n'
                    '[targets."public.b"]\npath = "lake/b"\nkeys = ["id"]\n')
    return file


def _spark_checkpoint(root: Path, ends: list[int], committed: int) -> None:
    """A checkpoint in Spark's format: batches 0..len(ends)-1 planned, 0..committed
    committed (as one ``tidemark run`` wrote it, conf cut short)."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text(json.dumps({"id": QUERY_ID}) + "\n")
    for batch, end in enumerate(ends):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1795595179750 + batch,
                "conf": {"spark.sql.shuffle.partitions": "200"}}
        (root / "offsets" / str(batch)).write_text(
            f"v1\n{json.dumps(meta, separators=(',', ':'))}\n"
            + json.dumps({"lsn": lsn_to_str(end)}))
        (root / "offsets" / f".{batch}.crc").write_bytes(b"crc")
        if batch <= committed:
            (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def _prepared_pipeline(db: Database, tmp_path: Path) -> tuple[Path, int]:
    """A slot, a pipeline file, table a written by batches 0 and 1 (b never), and a
    checkpoint with batch 1 committed and batch 2 planned (up to the server's WAL end).
    Returns the file and the end of batch 1 (where the slot is)."""
    db.autocommit("SELECT pg_create_logical_replication_slot('pipe', 'pgoutput')")
    slot = int(db.scalar("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM "
                         "pg_replication_slots WHERE slot_name = 'pipe'"))
    file = _pipeline_file(tmp_path, db, "pipe")
    config = load_config(file)
    Path(config.checkpoint).mkdir(exist_ok=True)  # a start makes it, after its checks
    target = config.targets[0]
    app_id = f"tidemark-{QUERY_ID}-public.a"
    apply_changes(target.path, rows(change("c", 10, 1, id=1, name="a", body="x"),
                                     change("c", 10, 2, id=2, name="b", body="y")),
                  ApplySpec(keys=("id",)), app_id=app_id, version=0)
    apply_changes(target.path, rows(change("c", 11, 1, id=3, name="c", body="z"),
                                    change("d", 11, 2, id=1)),
                  ApplySpec(keys=("id",)), app_id=app_id, version=1)
    WrittenTargets(config.checkpoint).record(target)
    db.execute("CREATE TABLE filler (x int)", "INSERT INTO filler VALUES (1)")
    _spark_checkpoint(Path(config.checkpoint), [slot - 100, slot, db.insert_lsn()],
                      committed=1)
    return file, slot


def test_pipeline_status_reads_delta_checkpoint_and_slot_without_spark(
        db: Database, tmp_path: Path) -> None:
    file, slot = _prepared_pipeline(db, tmp_path)
    code, status = _status(str(file))
    assert code == 0, status["problems"]
    assert status["kind"] == "pipeline" and status["config"] == str(file)
    assert status["checkpoint"] == {
        "path": str(tmp_path / "chk"), "query_id": QUERY_ID,
        "last_offset_batch": 2, "last_offset_lsn": status["checkpoint"]["last_offset_lsn"],
        "last_committed_batch": 1, "last_committed_lsn": lsn_to_str(slot),
        "batch_in_progress": True}
    a, b = status["targets"]
    assert a["table"] == "public.a" and a["exists"] and not a["lost"]
    # Version 0 creates the table, then one MERGE per batch; ids 2 and 3 are left.
    assert a["delta_version"] == 2 and a["rows"] == 2
    assert a["app_id"] == f"tidemark-{QUERY_ID}-public.a" and a["last_batch_id"] == 1
    assert a["last_commit_at"].endswith("Z") and a["problem"] is None
    assert b["table"] == "public.b" and not b["exists"] and b["delta_version"] is None
    assert status["slot"]["confirmed_flush_lsn"] == lsn_to_str(slot)
    assert status["lag"]["from"] == "checkpoint"
    assert status["lag"]["from_lsn"] == lsn_to_str(slot) and status["lag"]["bytes"] >= 0
    assert status["last_run"] is None
    # A checkpoint written before snapshots existed: nothing to load.
    assert status["snapshot"]["completed"] is True
    assert "predates snapshots" in status["snapshot"]["note"]

    text = _tidemark("status", str(file))
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"pipeline {file}: OK")
    assert (f"last committed batch 1 (up to {lsn_to_str(slot)}); batch 2 in progress"
            in text.stdout)
    assert "public.b  not created yet" in text.stdout
    # Fast because Spark is not even imported.
    imports = subprocess.run([sys.executable, "-X", "importtime", "-m", "tidemark", "status",
                              str(file)], capture_output=True, text=True, check=False)
    # (The kind's status module is imported by importlib, which -X importtime does not
    # list; what it imports, it does.)
    assert imports.returncode == 0 and "tidemark.status.report" in imports.stderr
    assert " pyspark" not in imports.stderr


def test_pipeline_problems_are_exit_1(db: Database, tmp_path: Path) -> None:
    file, _ = _prepared_pipeline(db, tmp_path)
    lake_a = tmp_path / "lake/a"

    # A target the checkpoint has written to is gone.
    shutil.move(lake_a, tmp_path / "saved_a")
    code, status = _status(str(file))
    assert code == 1 and status["targets"][0]["lost"]
    assert "is gone" in status["problems"][0]
    shutil.move(tmp_path / "saved_a", lake_a)

    # The slot advanced past what the checkpoint committed.
    db.execute("CREATE TABLE t (x int)", "INSERT INTO t VALUES (1)")
    db.autocommit("SELECT pg_replication_slot_advance('pipe', pg_current_wal_lsn())")
    code, status = _status(str(file))
    assert code == 1 and "past the checkpoint's last committed offset" in status["problems"][0]

    # The checkpoint comes from another server.
    shutil.rmtree(tmp_path / "chk/offsets")
    shutil.rmtree(tmp_path / "chk/commits")
    (tmp_path / "chk/metadata").unlink()
    _spark_checkpoint(tmp_path / "chk", [1 << 60], committed=0)
    code, status = _status(str(file))
    assert code == 1 and "ahead of this server's WAL" in status["problems"][0]

    # The slot is gone.
    db.autocommit("SELECT pg_drop_replication_slot('pipe')")
    code, status = _status(str(file))
    assert code == 1
    assert "replication slot 'pipe' does not exist on this server" in status["problems"]


def test_the_run_record_says_how_the_last_run_ended(db: Database, tmp_path: Path) -> None:
    file, _ = _prepared_pipeline(db, tmp_path)
    config = load_config(file)
    Path(config.checkpoint).mkdir(exist_ok=True)  # a start makes it, after its checks

    class Run:
        def __init__(self, error: Exception | None) -> None:
            self.config = config
            self.error = error

        @records_runs
        def run(self) -> None:
            if self.error is not None:
                raise self.error

    Run(None).run()
    record = read_record(config.checkpoint)
    assert record is not None and record.outcome == "finished" and record.error is None
    assert record.started_at is not None and record.ended_at is not None
    code, status = _status(str(file))
    assert code == 0 and status["last_run"]["outcome"] == "finished"

    with pytest.raises(RuntimeError):
        Run(RuntimeError("the source said no")).run()
    code, status = _status(str(file))
    assert code == 1 and status["last_run"]["outcome"] == "failed"
    assert status["last_run"]["error"] == "the source said no"
    assert "the last run failed: the source said no" in status["problems"]

    Run(None).run()  # a later run that ends well clears it
    code, status = _status(str(file))
    assert code == 0 and status["last_run"]["error"] is None
    assert (tmp_path / "chk" / FILE_NAME).is_file()


# -- a real pipeline ---------------------------------------------------------------------

@pytest.mark.slow
def test_status_after_a_real_tidemark_run(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, name text, body text)",
               "CREATE TABLE b (id int PRIMARY KEY, name text, body text)")
    db.autocommit("CREATE PUBLICATION p_real FOR TABLE a, b",
                  "SELECT pg_create_logical_replication_slot('real', 'pgoutput')")
    db.execute("INSERT INTO a SELECT g, 'n', 'x' FROM generate_series(1, 50) g")
    db.execute("DELETE FROM a WHERE id <= 5", "INSERT INTO b VALUES (1, 'n', 'b')")
    file = _pipeline_file(tmp_path, db, "real")
    env = {"PYSPARK_PYTHON": sys.executable}
    run = _tidemark("run", str(file), "--available-now", env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]

    code, status = _status(str(file))
    assert code == 0, status["problems"]
    chk = status["checkpoint"]
    assert chk["query_id"] and chk["last_committed_batch"] == chk["last_offset_batch"]
    assert not chk["batch_in_progress"]
    query_id = json.loads((tmp_path / "chk/metadata").read_text().splitlines()[0])["id"]
    assert chk["query_id"] == query_id
    a, b = status["targets"]
    assert (a["rows"], b["rows"]) == (45, 1)
    assert a["app_id"] == f"tidemark-{query_id}-public.a"
    assert a["last_batch_id"] is not None and a["last_batch_id"] <= chk["last_committed_batch"]
    run_record = status["last_run"]
    assert run_record["outcome"] == "finished" and run_record["error"] is None
    assert run_record["last_batch_id"] == chk["last_committed_batch"]
    assert status["slot"]["exists"] and status["lag"]["from"] == "checkpoint"
    assert status["lag"]["bytes"] >= 0
    # The slot follows the checkpoint one batch late, never ahead of it.
    assert (str_to_lsn(status["slot"]["confirmed_flush_lsn"])
            <= str_to_lsn(chk["last_committed_lsn"]))

    db.execute("INSERT INTO a SELECT g, 'n', repeat('y', 300) FROM generate_series(51, 1000) g")
    code, later = _status(str(file))
    assert code == 0 and later["lag"]["bytes"] > status["lag"]["bytes"] + 100_000
    text = _tidemark("status", str(file))
    assert text.returncode == 0 and "public.a" in text.stdout and "finished at" in text.stdout


def test_pipeline_status_shows_the_snapshot_running_and_what_is_left(
        db: Database, tmp_path: Path) -> None:
    file = _pipeline_file(tmp_path, db, "pipe")
    config = pipeline_facts(load_config(file), str(file))
    plan = SnapshotPlan(generation=2, at=0x1000, export="x", taken_us=0,
                        tables=("public.a", "public.b"), position=1, chunks_done=3,
                        estimates=(250_000, 150_000))
    running = snapshot_section(config, SourceOffset(0x900, known=(), snapshot=plan))
    assert running["completed"] is False and running["running"]["table"] == "public.b"
    assert running["note"] == ("running: snapshot public.b: chunk 3/~5 (table 2 of 2) "
                               "(snapshot at 0/1000)")
    left = snapshot_section(config, SourceOffset(0x900, known=("public.a",)))
    assert left["completed"] is False and left["note"].startswith("public.b will be loaded")
    done = snapshot_section(config, SourceOffset(0x900, known=("public.a", "public.b")))
    assert done["completed"] is True and done["note"].startswith("every target is loaded")
    assert snapshot_section(config, None)["note"].startswith("not started")


def test_pipeline_status_shows_the_merge_and_the_deleted_rows_of_a_merge_on_read_target(
        db: Database, tmp_path: Path) -> None:
    db.autocommit("SELECT pg_create_logical_replication_slot('pipe_mor', 'pgoutput')")
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{db.dsn}"\nslot = "pipe_mor"\n'
                    'publication = "p_pipe_mor"\n[spark]\ncheckpoint = "chk"\n'
                    '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\n'
                    'merge = "merge_on_read"\n'
                    '[targets."public.b"]\npath = "lake/b"\nkeys = ["id"]\n')
    config = load_config(file)
    Path(config.checkpoint).mkdir()
    target = config.targets[0]
    app_id = f"tidemark-{QUERY_ID}-public.a"
    apply_changes(target.path, rows(*(change("c", 10, i + 1, id=i, name="a", body="x")
                                      for i in range(10))),
                  target.spec, app_id=app_id, version=0)
    result = apply_changes(target.path, rows(change("u", 11, 1, id=1, name="b", body="x"),
                                             change("d", 11, 2, id=2)),
                           target.spec, app_id=app_id, version=1)
    assert result.merge == "merge_on_read"
    WrittenTargets(config.checkpoint).record(target)
    _, status = _status(str(file))
    a, b = status["targets"]
    assert a["merge"] == "merge_on_read" and b["merge"] == "copy_on_write"
    # 10 rows written, 2 marked deleted in the first file, 1 new version in a new file.
    assert a["deletion_vector_files"] == 1 and a["deleted_rows"] == 2
    assert a["deleted_fraction"] == round(2 / 11, 4) and a["rows"] == 9
    assert b["deletion_vector_files"] is None
    text = _tidemark("status", str(file))
    assert "merge:\n  public.a: merge_on_read, 1 of 2 files with deletion vectors, 2 rows " \
           "deleted (18.2% of the rows)" in text.stdout, text.stdout
