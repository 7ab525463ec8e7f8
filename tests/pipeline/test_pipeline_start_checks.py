"""``tidemark run`` checks what it can before anything is created: a setting naming a
column the table lacks, and a target directory that cannot be made, end the run at
once with one line naming the key, and leave nothing behind: no slot or publication,
no checkpoint or target directory (every source: PostgreSQL, MariaDB, log tables on
PostgreSQL and SQLite)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import Database
from logtable_helpers import LogDb

pytestmark = pytest.mark.integration


@dataclass
class Source:
    """A source database holding ``orders (id, name)``, as a pipeline file names it."""

    dsn: str
    table: str
    extra: str = ""


@pytest.fixture(params=["postgres", "mariadb", "logtable-postgres", "logtable-sqlite"])
def source(request: pytest.FixtureRequest, tmp_path: Path) -> Source:
    create = "CREATE TABLE orders (id INT PRIMARY KEY, name VARCHAR(20))"
    if request.param == "postgres":
        db: Database = request.getfixturevalue("db")
        db.execute(create)
        return Source(db.dsn, "public.orders",
                      f'slot = "s_{db.name}"\npublication = "p_{db.name}"\n')
    if request.param == "mariadb":
        mdb = request.getfixturevalue("mdb")
        mdb.execute(create)
        return Source(mdb.dsn, f"{mdb.name}.orders")
    if request.param == "logtable-sqlite":
        path = tmp_path / "app.db"
        path.touch()
        log = LogDb("sqlite", f"sqlite:///{path}", path)
    else:
        log = LogDb("postgres", request.getfixturevalue("db").dsn)
    log.execute(create)
    log.install(["orders"])
    kind = 'kind = "logtable"\n' if log.kind == "postgres" else ""
    return Source(log.dsn, log.table("orders"), kind)


def _run(tmp_path: Path, source: Source, target: str) -> subprocess.CompletedProcess[str]:
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{source.dsn}"\n{source.extra}\n[spark]\n'
                    f'checkpoint = "chk"\navailable_now = true\n'
                    f'[targets."{source.table}"]\n{target}\n')
    return subprocess.run([sys.executable, "-m", "tidemark", "run", str(file)],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})


def _one_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines()
              if line.strip() and not line.startswith("tidemark run:")]
    assert len(errors) == 1, result.stderr  # one line: no traceback, no Spark log
    assert errors[0].startswith("error: ")
    return errors[0]


def _nothing_created(source: Source, request: pytest.FixtureRequest) -> None:
    tmp_path: Path = request.getfixturevalue("tmp_path")
    assert not (tmp_path / "chk").exists()  # the checkpoint is made after the checks
    assert not (tmp_path / "lake").exists()  # and so are the targets' directories
    if source.extra.startswith("slot"):
        db: Database = request.getfixturevalue("db")
        assert db.query("SELECT slot_name FROM pg_replication_slots "
                        "WHERE database = current_database()") == []
        assert db.query("SELECT pubname FROM pg_publication") == []


def test_key_the_table_lacks_is_refused_before_anything_starts(
        source: Source, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    result = _run(tmp_path, source, 'path = "lake/orders"\nkeys = ["nosuch"]')
    line = _one_error(result)
    assert f'targets."{source.table}".keys' in line
    assert "'nosuch'" in line
    assert "id, name" in line  # the columns there are
    _nothing_created(source, request)
    assert not (tmp_path / "chk" / "offsets").exists()  # Spark never started


def test_column_list_naming_a_missing_column_is_refused(
        source: Source, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    result = _run(tmp_path, source,
                  'path = "lake/orders"\nkeys = ["id"]\ncolumn_list = ["id", "nmae"]')
    line = _one_error(result)
    assert f'targets."{source.table}".column_list' in line
    assert "'nmae'" in line
    _nothing_created(source, request)


def test_target_path_that_cannot_be_created_names_key_and_path(
        source: Source, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    (tmp_path / "afile").write_text("not a directory")
    result = _run(tmp_path, source, 'path = "afile/lake/orders"\nkeys = ["id"]')
    line = _one_error(result)
    assert f'targets."{source.table}".path' in line
    assert str(tmp_path / "afile" / "lake" / "orders") in line
    assert "Not a directory" in line
    assert "Os {" not in line
    _nothing_created(source, request)


def test_target_uri_delta_rs_cannot_reach_is_refused_at_start(
        source: Source, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    result = _run(tmp_path, source, 'path = "nosuch://bucket/orders"\nkeys = ["id"]')
    line = _one_error(result)
    assert f'targets."{source.table}".path' in line
    assert "nosuch://bucket/orders" in line and "Unknown scheme: nosuch" in line
    _nothing_created(source, request)
    assert not (tmp_path / "chk" / "offsets").exists()  # Spark never started


def test_merge_on_read_of_an_object_store_target_is_refused_at_start(
        source: Source, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    result = _run(tmp_path, source,
                  'path = "s3://bucket/orders"\nkeys = ["id"]\nmerge = "merge_on_read"')
    line = _one_error(result)
    assert f'targets."{source.table}".merge' in line
    assert "s3://bucket/orders is not local" in line and '"copy_on_write"' in line
    _nothing_created(source, request)
    assert not (tmp_path / "chk" / "offsets").exists()  # Spark never started


def _run_file(tmp_path: Path, source: str, table: str) -> subprocess.CompletedProcess[str]:
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\n{source}\n[spark]\ncheckpoint = "chk"\n'
                    f'available_now = true\n[targets."{table}"]\npath = "lake/t"\n'
                    'keys = ["id"]\n')
    return subprocess.run([sys.executable, "-m", "tidemark", "run", str(file)],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})


@pytest.mark.parametrize(("source", "table", "says"), [
    ('dsn = "host=127.0.0.1 port=1 dbname=x user=x connect_timeout=2"', "public.t",
     "cannot connect to PostgreSQL"),
    ('dsn = "host=127.0.0.1 port=1 dbname=x user=x connect_timeout=2"\nkind = "logtable"',
     "public.t", "cannot connect to PostgreSQL"),
    ('dsn = "sqlite:///{tmp}/missing.db"', "main.t", "does not exist"),
    ('dsn = "sqlite:///{tmp}/missing.db"\nslot = "other"', "main.t",
     "source.slot: does not apply to log tables"),
    ('dsn = "host=127.0.0.1 port=1 dbname=x user=x"\nretention_s = 60', "public.t",
     "source.retention_s: applies to log tables only"),
])
def test_a_failed_start_leaves_no_checkpoint_or_target_directory(
        tmp_path: Path, source: str, table: str, says: str) -> None:
    """Cannot connect, no such SQLite file, a refused setting: one line, and neither
    the checkpoint nor a target's directory is left behind."""
    line = _one_error(_run_file(tmp_path, source.format(tmp=tmp_path), table))
    assert says in line, line
    assert not (tmp_path / "chk").exists()
    assert not (tmp_path / "lake").exists()
