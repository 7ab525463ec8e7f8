"""Offsets that must not be trusted, on a real PostgreSQL.

An offsets file of the wrong shape or in a place that cannot be written is refused
before the slot or publication is touched.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import Database

SLOT = "tidemark"


# -- helpers ----------------------------------------------------------------------------
def _cli(db: Database, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemark", "capture", "--table", "public.t", *args],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "TIDEMARK_DSN": db.dsn}, check=False,
    )


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The single ``error: …`` line a failed run printed (and nothing else)."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    return lines[0]


def _slots_and_publications(db: Database) -> tuple[int, int]:
    return (int(db.scalar("SELECT count(*) FROM pg_replication_slots "
                          "WHERE database = current_database()")),
            int(db.scalar("SELECT count(*) FROM pg_publication")))


# -- 13. offsets files of the wrong shape, or where nothing can be written ------------------
_BAD_SHAPES = {
    "lsn-text": ('{"KEY": {"lsn": "abc"}}', '"abc"'),
    "offset-number": ('{"KEY": 5}', "5"),
    "top-level-list": ('[{"lsn": 1}]', "JSON object"),
    "no-lsn": ('{"KEY": {"snapshot_completed": true}}', "lsn"),
    "negative-lsn": ('{"KEY": {"lsn": -1, "snapshot_completed": true}}', "-1"),
    "boolean-lsn": ('{"KEY": {"lsn": true, "snapshot_completed": true}}', "true"),
    "completed-text": ('{"KEY": {"lsn": 1, "snapshot_completed": "yes"}}', '"yes"'),
}


@pytest.mark.parametrize("content,shown", list(_BAD_SHAPES.values()), ids=list(_BAD_SHAPES))
def test_cli_offsets_of_the_wrong_shape_exit_2_before_any_slot(
        db: Database, tmp_path: Path, content: str, shown: str) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    path = tmp_path / "offsets.json"
    path.write_text(content.replace("KEY", f"postgres/{db.name}/{SLOT}"))
    proc = _cli(db, "--offsets", str(path), "--stop-at-end")
    assert proc.returncode == 2, proc.stderr
    line = _one_error_line(proc)
    assert line.startswith("error: offsets: ")
    assert str(path) in line
    assert shown in line  # what is wrong
    assert "lsn" in line or "object" in line  # what is allowed
    assert proc.stdout == ""
    assert _slots_and_publications(db) == (0, 0)


def _under_a_file(tmp_path: Path) -> Path:
    parent = tmp_path / "plain-file"
    parent.write_text("not a directory")
    return parent / "offsets.json"


@pytest.mark.parametrize("where", [
    _under_a_file,
    # procfs refuses new files to root as well.
    lambda tmp_path: Path(f"/proc/tidemark-offsets-{os.getpid()}.json"),
], ids=["parent-is-a-file", "under-proc"])
def test_cli_unwritable_offsets_path_exits_2_before_any_slot(
        db: Database, tmp_path: Path, where: Callable[[Path], Path]) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    path = where(tmp_path)
    proc = _cli(db, "--offsets", str(path), "--stop-at-end")
    assert proc.returncode == 2, proc.stderr
    line = _one_error_line(proc)
    assert line.startswith("error: offsets: ")
    assert str(path.parent) in line
    assert proc.stdout == ""
    assert _slots_and_publications(db) == (0, 0)


