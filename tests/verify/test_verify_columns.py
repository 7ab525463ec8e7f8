"""A source column the target does not hold is a difference (not skipped), unless the
target leaves it out on purpose or the stream does not carry it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from target_helpers import quiet, target_file, write_target

from conftest import Database
from tidemark.verify.report import text_report
from tidemark.verify.run import verify

_SCHEMA = pa.schema([("id", pa.int32()), ("v", pa.string())])


def _source(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text, extra text, "
               "g int GENERATED ALWAYS AS (id * 2) STORED)",
               "INSERT INTO t VALUES (1, 'a', 'x'), (2, 'b', 'y')")
    write_target(tmp_path / "lake/t", [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}], _SCHEMA)


def test_a_source_column_the_target_lacks_is_a_difference(db: Database,
                                                           tmp_path: Path) -> None:
    _source(db, tmp_path)
    result = verify(target_file(tmp_path, db.dsn, db.name, "public.t"), wait_s=0,
                    open_snapshot=quiet(db.dsn))
    assert result.exit_code == 1, result.as_json()
    (table,) = result.tables
    # g is a generated column the publication does not publish: the stream never
    # carries it, so the target is right not to hold it.
    assert [(d.kind, d.columns) for d in table.differences] == [("column", ("extra",))]
    assert any("column: column extra is in the source but not in the target" in line
               for line in text_report(result)), text_report(result)


def test_a_column_left_out_on_purpose_is_not_a_difference(db: Database,
                                                          tmp_path: Path) -> None:
    _source(db, tmp_path)
    for setting in ('except_column_list = ["extra"]\n', 'column_list = ["id", "v"]\n'):
        file = target_file(tmp_path, db.dsn, db.name, "public.t", setting)
        result = verify(file, wait_s=0, open_snapshot=quiet(db.dsn))
        assert result.exit_code == 0, (setting, result.as_json())
