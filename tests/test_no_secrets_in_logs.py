"""No password reaches a log line, at any ``--log-level`` (py4j logs every command it
sends to the JVM at DEBUG, the Spark source's DSN option among them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Database
from tidemark.cli.logs import redact

pytestmark = pytest.mark.integration

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _tidemark(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "tidemark", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, check=False,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    return output


@pytest.mark.parametrize("level", LEVELS)
def test_capture_logs_no_password(db: Database, tmp_path: Path, level: str) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    secret = db.cluster.password  # in db.dsn: the cluster checks passwords
    output = _tidemark("--log-level", level, "capture", "--dsn", db.dsn,
                       "--table", "public.t", "--slot", f"s_{db.name}", "--stop-at-end",
                       cwd=tmp_path)
    assert '"id":1' in output
    if level in ("DEBUG", "INFO"):
        assert "INFO tidemark" in output  # the level reached tidemark's loggers
    assert secret not in output


@pytest.mark.slow
def test_run_logs_no_password_even_at_debug(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a')")
    secret = db.cluster.password
    (tmp_path / "pipeline.toml").write_text(
        f'[source]\ndsn = "{db.dsn}"\nslot = "s_{db.name}"\n'
        '[spark]\ncheckpoint = "chk"\navailable_now = true\n'
        '[targets."public.t"]\npath = "lake/t"\nkeys = ["id"]\n')
    for level in LEVELS:
        output = _tidemark("--log-level", level, "run", "pipeline.toml", cwd=tmp_path)
        assert secret not in output, level
        if level == "DEBUG":
            assert "INFO tidemark" in output


@pytest.mark.parametrize(("text", "expected"), [
    ("host=h password=abc dbname=d", "host=h password=*** dbname=d"),
    ("dsn='host=h PASSWORD = \"x\" sslpassword='y z''", "sslpassword=***"),
    ("postgresql://me:abc@db:5432/app", "postgresql://me:***@db:5432/app"),
])
def test_redact(text: str, expected: str) -> None:
    assert expected in redact(text)
    assert "abc" not in redact(text)
