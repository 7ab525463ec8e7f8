"""``tidemark run`` and a slot the checkpoint does not vouch for: a slot made again while
the pipeline was stopped is refused before Spark starts (one line, exit 2), and the
documented repair (a new checkpoint, whose snapshot replaces the targets) makes the
targets equal to the source again; a pipeline killed right after making its slot loses
nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Database
from tidemark.pipeline.compare import compare

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 110


def _setup(db: Database, tmp_path: Path, checkpoint: str = "chk") -> Path:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               f"INSERT INTO t SELECT i, 'v0' FROM generate_series(1, {ROWS}) i")
    return _config(db, tmp_path, checkpoint)


def _config(db: Database, tmp_path: Path, checkpoint: str) -> Path:
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[source]\ndsn = "{db.dsn}"\nslot = "s_{db.name}"\npublication = "p_{db.name}"\n'
        f'[spark]\ncheckpoint = "{checkpoint}"\navailable_now = true\n'
        '[targets."public.t"]\npath = "lake/t"\nkeys = ["id"]\n')
    return file


def _run(file: Path, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    if fault is not None:
        env["TIDEMARK_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "tidemark", "run", str(file)], text=True,
                          capture_output=True, cwd=file.parent, env=env, timeout=300,
                          start_new_session=True, check=False)


def _equal(db: Database, tmp_path: Path) -> bool:
    source, lake = compare(db.dsn, "public.t", str(tmp_path / "lake/t"), ["id", "v"])
    return bool(source == lake)


def test_a_slot_made_again_is_refused_and_a_new_checkpoint_repairs_the_target(
        db: Database, tmp_path: Path) -> None:
    file = _setup(db, tmp_path)
    first = _run(file)
    assert first.returncode == 0, first.stderr[-3000:]
    assert _equal(db, tmp_path)
    slot = f"s_{db.name}"
    db.execute(f"SELECT pg_drop_replication_slot('{slot}')")
    db.execute("UPDATE t SET v = 'gap' WHERE id <= 31", "DELETE FROM t WHERE id = 100",
               f"INSERT INTO t VALUES ({ROWS + 1}, 'gap')")
    db.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    db.execute("UPDATE t SET v = 'after' WHERE id = 2")

    refused = _run(file)
    assert refused.returncode == 2, refused.stderr[-3000:]
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, refused.stderr[-3000:]
    assert f"'{slot}'" in errors[0] and "new one" in errors[0]
    assert "Traceback" not in refused.stderr
    assert not _equal(db, tmp_path)  # nothing was applied over the gap

    repaired = _run(_config(db, tmp_path, "chk2"))  # the repair the error names
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    assert _equal(db, tmp_path)  # the row deleted in the gap is gone from Delta too


def test_a_pipeline_killed_right_after_making_its_slot_loses_nothing(
        db: Database, tmp_path: Path) -> None:
    file = _setup(db, tmp_path)
    killed = _run(file, fault="after_slot_created:0")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                     (f"s_{db.name}",)) == 1
    db.execute("UPDATE t SET v = 'later' WHERE id <= 10", "DELETE FROM t WHERE id = 50",
               f"INSERT INTO t VALUES ({ROWS + 1}, 'later')")
    again = _run(file)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _equal(db, tmp_path)
