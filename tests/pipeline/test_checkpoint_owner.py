"""A pipeline pointed at another pipeline's checkpoint is refused, and the owner goes on.

For every source (PostgreSQL's WAL, MariaDB's binlog, log tables on PostgreSQL and
SQLite): pipeline A runs; pipeline B, with A's ``spark.checkpoint``, is refused with one
line naming both pipelines; A's checkpoint is byte for byte what it was (B planned no
batch into it, recorded no run), nothing of B was created (PostgreSQL: no slot, no
publication; no target); A then resumes and applies the changes made meanwhile, once.
The rules of what makes a pipeline's identity: test_checkpoint_identity.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from conftest import Database, MariaDatabase
from logtable_helpers import LogDb
from pipeline_helpers import _prepare
from tidemark.errors import ConfigError
from tidemark.pipeline import load_config
from tidemark.pipeline.compare import compare
from tidemark.pipeline.runner import Pipeline

pytestmark = pytest.mark.integration


def _files(directory: Path) -> dict[str, bytes]:
    """Every file under *directory* (relative name to contents)."""
    return {str(f.relative_to(directory)): f.read_bytes()
            for f in sorted(directory.rglob("*")) if f.is_file()}


def _pipeline(tmp_path: Path, name: str, source: str, table: str, target: str) -> Path:
    file = tmp_path / f"{name}.toml"
    file.write_text(f'[source]\n{source}\n[spark]\ncheckpoint = "chk"\navailable_now = true\n'
                    f'[targets."{table}"]\npath = "lake/{target}"\nkeys = ["id"]\n')
    return file


def _refused_then_the_owner_goes_on(spark: SparkSession, tmp_path: Path, a: Path, b: Path,
                                    change: Callable[[], None],
                                    equal: Callable[[], bool]) -> str:
    """Run A, refuse B on A's checkpoint (untouched), run A again; B's error message."""
    Pipeline(load_config(a), spark=spark).run()
    assert equal()
    checkpoint = tmp_path / "chk"
    before = _files(checkpoint)
    change()
    with pytest.raises(ConfigError) as refused:
        Pipeline(load_config(b), spark=spark).run()
    message = str(refused.value)
    assert message.startswith("spark.checkpoint: ") and "\n" not in message, message
    assert "belongs to another pipeline" in message and "own spark.checkpoint" in message
    assert _files(checkpoint) == before, "the refused pipeline wrote to the checkpoint"
    assert not (tmp_path / "lake/b").exists()

    assert not equal()  # A has the change to apply
    Pipeline(load_config(a), spark=spark).run()
    assert equal()
    return message


def test_postgres_pipeline_on_another_s_checkpoint_is_refused_and_creates_nothing(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE acc (id int PRIMARY KEY, v text)",
               "CREATE TABLE other (id int PRIMARY KEY, v text)")
    a = _pipeline(tmp_path, "a", _prepare(db, "acc") + f'dsn = "{db.dsn}"',
                  "public.acc", "a")
    # B has its own slot and publication, not made yet: the source would make them.
    b = _pipeline(tmp_path, "b", f'dsn = "{db.dsn}"\nslot = "b_slot"\npublication = '
                  '"b_pub"', "public.other", "b")
    db.execute("INSERT INTO acc SELECT g, 'first' FROM generate_series(1, 20) g")

    def change() -> None:
        db.execute("UPDATE acc SET v = 'second' WHERE id <= 5", "DELETE FROM acc WHERE id = 20",
                   "INSERT INTO acc VALUES (100, 'new')", "INSERT INTO other VALUES (1, 'b')")

    def equal() -> bool:
        source, lake = compare(db.dsn, "public.acc", str(tmp_path / "lake/a"), ["id", "v"])
        return source == lake

    message = _refused_then_the_owner_goes_on(spark, tmp_path, a, b, change, equal)
    assert f"postgres database {db.name}, slot s_{db.name}, targets public.acc -> " \
           f"{tmp_path / 'lake/a'}" in message
    assert f"postgres database {db.name}, slot b_slot, targets public.other -> " \
           f"{tmp_path / 'lake/b'}" in message
    assert db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'b_slot'") == 0
    assert db.scalar("SELECT count(*) FROM pg_publication WHERE pubname = 'b_pub'") == 0

    # The command says the same in one line, and exits 2.
    before = _files(tmp_path / "chk")
    result = subprocess.run([sys.executable, "-m", "tidemark", "run", str(b)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {message}"], result.stderr
    assert _files(tmp_path / "chk") == before


def test_mariadb_pipeline_on_another_s_checkpoint_is_refused(
        spark: SparkSession, mdb: MariaDatabase, tmp_path: Path) -> None:
    mdb.execute("CREATE TABLE acc (id INT PRIMARY KEY, v VARCHAR(20))",
                "CREATE TABLE other (id INT PRIMARY KEY, v VARCHAR(20))",
                "INSERT INTO acc VALUES " + ",".join(f"({i}, 'first')" for i in range(1, 21)))
    a = _pipeline(tmp_path, "a", f'dsn = "{mdb.dsn}"', f"{mdb.name}.acc", "a")
    b = _pipeline(tmp_path, "b", f'dsn = "{mdb.dsn}"', f"{mdb.name}.other", "b")

    def change() -> None:
        mdb.execute("UPDATE acc SET v = 'second' WHERE id <= 5", "DELETE FROM acc WHERE id = 20",
                    "INSERT INTO acc VALUES (100, 'new')", "INSERT INTO other VALUES (1, 'b')")

    def equal() -> bool:
        source, lake = compare(mdb.dsn, f"{mdb.name}.acc", str(tmp_path / "lake/a"),
                               ["id", "v"])
        return source == lake

    message = _refused_then_the_owner_goes_on(spark, tmp_path, a, b, change, equal)
    assert "it has none of these targets" in message
    assert f"targets {mdb.name}.acc -> " in message and f"targets {mdb.name}.other -> " in message


def test_log_table_pipeline_on_another_s_checkpoint_is_refused(
        spark: SparkSession, logdb: LogDb, tmp_path: Path) -> None:
    logdb.execute("CREATE TABLE acc (id integer PRIMARY KEY, v text)",
                  "CREATE TABLE other (id integer PRIMARY KEY, v text)",
                  *(f"INSERT INTO acc VALUES ({i}, 'first')" for i in range(1, 21)))
    logdb.install(["acc", "other"])
    kind = "" if logdb.kind == "sqlite" else 'kind = "logtable"\n'
    source = f'dsn = "{logdb.dsn}"\n{kind}'
    a = _pipeline(tmp_path, "a", source, logdb.table("acc"), "a")
    b = _pipeline(tmp_path, "b", source, logdb.table("other"), "b")

    def change() -> None:
        logdb.execute("UPDATE acc SET v = 'second' WHERE id <= 5",
                      "DELETE FROM acc WHERE id = 20", "INSERT INTO acc VALUES (100, 'new')",
                      "INSERT INTO other VALUES (1, 'b')")

    def equal() -> bool:
        source, lake = compare(logdb.dsn, logdb.table("acc"), str(tmp_path / "lake/a"),
                               ["id", "v"])
        return source == lake

    message = _refused_then_the_owner_goes_on(spark, tmp_path, a, b, change, equal)
    assert "it has none of these targets" in message and "logtable database" in message
