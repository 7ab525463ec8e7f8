"""A verify that cannot compare says why as its error (exit 2, kept in verify.json),
naming the table and the step: never a traceback, never "differences"."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from target_helpers import quiet, target_file, write_target

from conftest import Database, MariaDatabase
from tidemark.status.verify_record import read_record
from tidemark.verify.run import verify

_SCHEMA = pa.schema([("id", pa.int32()), ("v", pa.string())])


def _failed(file: Path, **kw: object) -> str:
    result = verify(file, wait_s=0, **kw)  # type: ignore[arg-type]
    assert result.exit_code == 2, result.as_json()
    assert result.error is not None
    record = read_record(file.parent / "chk")
    assert record is not None and record["result"] == "error"
    assert record["error"] == result.error
    return result.error


def test_a_source_column_a_dialect_cannot_read_as_the_target_type(
        db: Database, tmp_path: Path) -> None:
    """The target holds a date where the source has text: PostgreSQL refuses the
    checksum's date arithmetic on text (a psycopg error)."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'x')")
    write_target(tmp_path / "lake/t", [{"id": 1, "v": None}],
                 pa.schema([("id", pa.int32()), ("v", pa.date32())]))
    error = _failed(target_file(tmp_path, db.dsn, db.name, "public.t"),
                    open_snapshot=quiet(db.dsn))
    assert "comparing public.t with its source failed: psycopg" in error, error


def test_a_missing_mariadb_table(mdb: MariaDatabase, tmp_path: Path) -> None:
    write_target(tmp_path / "lake/t", [{"id": 1, "v": "x"}], _SCHEMA)
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{mdb.dsn}"\n[spark]\ncheckpoint = "chk"\n'
                    f'[targets."{mdb.name}.gone"]\npath = "lake/t"\nkeys = ["id"]\n')
    error = _failed(file)
    assert f"{mdb.name}.gone" in error and "does not exist" in error, error


def test_a_mariadb_column_without_a_canonical_text(mdb: MariaDatabase,
                                                   tmp_path: Path) -> None:
    """A varchar source column whose target holds a date (UnsupportedColumnError)."""
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))",
                "INSERT INTO t VALUES (1, 'x')")
    write_target(tmp_path / "lake/t", [{"id": 1, "v": None}],
                 pa.schema([("id", pa.int32()), ("v", pa.date32())]))
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{mdb.dsn}"\n[spark]\ncheckpoint = "chk"\n'
                    f'[targets."{mdb.name}.t"]\npath = "lake/t"\nkeys = ["id"]\n')
    error = _failed(file)
    assert f"comparing {mdb.name}.t with its source failed" in error, error
    assert "column v (varchar(10)) has no canonical text" in error, error
