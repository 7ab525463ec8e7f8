"""Targets verify or --repair cannot handle soundly are refused, saying why and what
to do instead."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from target_helpers import quiet, target_file, write_target

from conftest import Database
from tidemark.verify.run import verify

_SCHEMA = pa.schema([("id", pa.int32()), ("v", pa.string())])


def _source(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a')")
    write_target(tmp_path / "lake/t", [{"id": 1, "v": "a"}], _SCHEMA)


def test_an_ignore_null_updates_target_is_refused(db: Database, tmp_path: Path) -> None:
    _source(db, tmp_path)
    file = target_file(tmp_path, db.dsn, db.name, "public.t", "ignore_null_updates = true\n",
                       signal='signal_table = "public.sig"\n')
    for repair in (False, True):
        result = verify(file, wait_s=0, open_snapshot=quiet(db.dsn), repair=repair)
        assert result.exit_code == 2, result.as_json()
        assert result.error is not None
        assert "ignore_null_updates" in result.error
        assert "differs from its source by design" in result.error


def test_repair_of_a_target_with_its_own_sequence_is_refused(db: Database,
                                                             tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text, updated_at bigint)",
               "INSERT INTO t VALUES (1, 'a', 1)")
    write_target(tmp_path / "lake/t", [{"id": 1, "v": "b", "updated_at": 1}],
                 _SCHEMA.append(pa.field("updated_at", pa.int64())))
    file = target_file(tmp_path, db.dsn, db.name, "public.t",
                       'sequence_by = ["updated_at"]\n',
                       signal='signal_table = "public.sig"\n')
    # Verify alone compares it (the difference is found) ...
    assert verify(file, wait_s=0, open_snapshot=quiet(db.dsn)).exit_code == 1
    # ... a repair is refused before anything is sent.
    result = verify(file, wait_s=0, open_snapshot=quiet(db.dsn), repair=True)
    assert result.exit_code == 2, result.as_json()
    assert result.error is not None
    assert "orders changes by updated_at" in result.error
    assert "execute-snapshot public.t" in result.error
