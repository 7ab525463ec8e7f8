"""``tidemark-repair`` through ``tidemark run``: a target tampered with behind the
pipeline's back (a row deleted, a value changed, a row the source lacks added) equals
its source again after a repair signal for those keys; only those keys are written, the
signal is applied once across a crash after its batch was read, and an SCD2 history
gets one new version per changed key and none for an unchanged one."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from conftest import Database
from delta_rows import live_table
from pipeline_helpers import _batch_lines, _prepare, _tidemark_run
from tidemark.event import TableId
from tidemark.pipeline.compare import compare
from tidemark.source.repair_signal import repair_signal_data
from tidemark.source.signals import SignalError, parse_signal, send_signal, signal_table_ddl
from tidemark.spark_checkpoint import last_batch

pytestmark = pytest.mark.integration

TABLES = ("a", "b", "s")
KEYS = [{"id": 3}, {"id": 5}, {"id": 7}, {"id": 999}]


def _config(tmp_path: Path, db: Database) -> Path:
    source = _prepare(db, *TABLES) + (f'dsn = "{db.dsn}"\n'
                                      'signal_table = "public.dbz_signal"\n')
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f"[source]\n{source}"
        '[spark]\ncheckpoint = "chk"\navailable_now = true\nmaster = "local[1]"\n'
        'conf = { "spark.ui.enabled" = "false", "spark.sql.shuffle.partitions" = "1" }\n'
        '[targets."public.a"]\npath = "lake/a"\nkeys = ["id"]\nsnapshot = "never"\n'
        '[targets."public.b"]\npath = "lake/b"\nkeys = ["id"]\nsnapshot = "never"\n'
        "stored_as_scd_type = 2\n"
        '[targets."public.s"]\npath = "lake/s"\nkeys = ["id"]\nsnapshot = "never"\n'
        'soft_delete_column = "deleted"\n')
    return file


def _run(config: Path, log: Path, fault: str | None = None) -> list[str]:
    proc = _tidemark_run(config, log, extra_env={"TIDEMARK_FAULT": fault} if fault else None)
    code = proc.wait(300)
    text = log.read_text(errors="replace")
    assert code == (-signal.SIGKILL if fault else 0), text[-4000:]
    return _batch_lines(log)


def _equal(db: Database, tmp_path: Path, table: str) -> bool:
    path = str(tmp_path / "lake" / table)
    if table == "s":  # soft-deleted rows are marked, not gone
        rows = live_table(DeltaTable(path))
        live = rows.filter(pc.invert(pc.fill_null(rows.column("deleted"), False)))
        found = sorted(zip(live.column("id").to_pylist(), live.column("v").to_pylist(),
                           strict=True))
        return found == sorted(db.query("SELECT id, v FROM s"))
    source, lake = compare(db.dsn, f"public.{table}", path, ["id", "v"], scd2=table == "b")
    return bool(source == lake)


def _tamper(tmp_path: Path) -> None:
    """Key 3 deleted, 5 changed, 999 added behind the pipeline's back; 7 left alone."""
    for table in TABLES:
        target = DeltaTable(str(tmp_path / "lake" / table))
        current = "__END_AT IS NULL AND " if table == "b" else ""
        target.delete(f"{current}id = 3")
        target.update({"v": "'tampered'"}, predicate=f"{current}id = 5")
        rows = live_table(target)
        extra = rows.filter(pc.equal(rows.column("id"), 7))
        if table == "b":
            extra = extra.filter(pc.is_null(extra.column("__END_AT")))
        columns = {n: extra.column(n) for n in extra.column_names}
        columns["id"] = pa.array([999], extra.schema.field("id").type)
        write_deltalake(str(tmp_path / "lake" / table), pa.table(columns, schema=extra.schema),
                        mode="append")


def _rows(tmp_path: Path, table: str) -> dict[int, tuple[object, ...]]:
    rows = live_table(DeltaTable(str(tmp_path / "lake" / table))).to_pylist()
    return {r["id"]: tuple(v for n, v in sorted(r.items()) if not n.startswith("_"))
            for r in rows}


def _versions(tmp_path: Path) -> Counter[int]:
    history = live_table(DeltaTable(str(tmp_path / "lake/b")))
    return Counter(history.column("id").to_pylist())


def test_the_repair_signal_is_checked_and_cut_to_fit_the_signal_table() -> None:
    with pytest.raises(SignalError, match=r"keys must be a non-empty list.*data-collection"):
        parse_signal("x", "tidemark-repair", '{"data-collection": "public.a", "keys": []}')
    with pytest.raises(SignalError, match=r"keys\[1\] names the columns k"):
        parse_signal("x", "tidemark-repair",
                     '{"data-collection": "public.a", "keys": [{"id": 1}, {"k": 2}]}')
    with pytest.raises(SignalError, match="unknown key 'tables'"):
        parse_signal("x", "tidemark-repair", '{"tables": ["public.a"]}')
    parsed = parse_signal("x", "tidemark-repair", '{"data-collection": "a", "keys": '
                          '[{"id": 1, "k": "x"}, {"k": "y", "id": 2}, {"id": 1, "k": "x"}]}')
    assert parsed.table == TableId("public", "a")  # type: ignore[union-attr]
    assert parsed.keys == ((1, "x"), (2, "y"))  # type: ignore[union-attr]
    from tidemark.source.repair_signal import repair_signals_data  # noqa: PLC0415

    chunks = repair_signals_data("public.a", [{"id": i} for i in range(1000)])
    assert len(chunks) > 1 and sum(len(c["keys"]) for c in chunks) == 1000


def test_a_repair_signal_mends_tampered_targets_once_across_a_crash(
        db: Database, tmp_path: Path) -> None:
    db.execute(signal_table_ddl(TableId.parse("public.dbz_signal")),
               *(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)" for t in TABLES))
    config = _config(tmp_path, db)
    db.execute(*(f"INSERT INTO {t} SELECT g, '{t}' || g FROM generate_series(1, 20) g"
                 for t in TABLES))
    _run(config, tmp_path / "run-1.log")
    assert all(_equal(db, tmp_path, t) for t in TABLES)

    _tamper(tmp_path)
    assert not any(_equal(db, tmp_path, t) for t in TABLES)
    before = _versions(tmp_path)
    tampered = {t: _rows(tmp_path, t) for t in ("a", "s")}
    start_of_7 = {r["__START_AT"] for r in live_table(DeltaTable(str(tmp_path / "lake/b")))
                  .to_pylist() if r["id"] == 7 and r["__END_AT"] is None}
    db.execute(*(f"UPDATE {t} SET v = 'streamed' WHERE id = 8" for t in TABLES))
    for table in TABLES:
        send_signal(db.dsn, "public.dbz_signal", "tidemark-repair",
                    repair_signal_data(f"public.{table}", KEYS))

    # Killed after the batch that takes the signals was read, before Delta has any of it.
    batch = (last_batch(tmp_path / "chk" / "offsets") or 0) + 1
    _run(config, tmp_path / "run-2.log", f"after_read:{batch}")
    lines = _run(config, tmp_path / "run-3.log")
    assert all(_equal(db, tmp_path, t) for t in TABLES)
    # The replayed batch and the next hold the stream's change (key 8) and 3 r + 1 d per
    # table, once: the repair is read at the end of the batch that reaches its
    # snapshot's point (this one, or the next when that point was not flushed yet).
    moved = [line for line in lines if "no changes" not in line]
    assert moved and all(int(line.split(":", 1)[0].split()[1]) in (batch, batch + 1)
                         for line in moved), lines
    for t in TABLES:
        assert sum(int(part.split("+")[1].split()[0]) for line in moved
                   for part in line.split(":", 1)[1].split(",")
                   if part.strip().startswith(f"public.{t} +")) == 5, lines

    # Only the listed keys and the streamed one changed in the targets (7 was rewritten
    # with the values it had).
    for table in ("a", "s"):
        after_rows = _rows(tmp_path, table)
        changed = {k for k in set(tampered[table]) | set(after_rows)
                   if tampered[table].get(k) != after_rows.get(k)}
        assert changed == {3, 5, 8, 999}, (table, changed)
    # SCD2: 3 gets a version, 5 a new one (its tampered one closed), 8 a new one (the
    # stream's), 999 is closed; 7 is unchanged: no version, the current one kept.
    after = _versions(tmp_path)
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {
        3: 1, 5: 1, 8: 1}
    current_7 = {r["__START_AT"] for r in live_table(DeltaTable(str(tmp_path / "lake/b")))
                 .to_pylist() if r["id"] == 7 and r["__END_AT"] is None}
    assert current_7 == start_of_7


def test_a_repair_key_the_source_cannot_read_is_skipped_not_fatal(
        db: Database, tmp_path: Path) -> None:
    """``1.0`` and ``"abc"`` for an integer key: the signal is skipped with a warning
    naming the key and the column's type when taken; the stream goes on, and a good
    signal in the same batch is applied."""
    db.execute(signal_table_ddl(TableId.parse("public.dbz_signal")),
               *(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)" for t in TABLES))
    config = _config(tmp_path, db)
    db.execute(*(f"INSERT INTO {t} SELECT g, '{t}' || g FROM generate_series(1, 20) g"
                 for t in TABLES))
    _run(config, tmp_path / "run-1.log")
    _tamper(tmp_path)
    send_signal(db.dsn, "public.dbz_signal", "tidemark-repair",
                repair_signal_data("public.a", [{"id": 1.0}]))
    send_signal(db.dsn, "public.dbz_signal", "tidemark-repair",
                repair_signal_data("public.b", [{"id": "abc"}]))
    send_signal(db.dsn, "public.dbz_signal", "tidemark-repair",
                repair_signal_data("public.s", KEYS))
    _run(config, tmp_path / "run-2.log")
    text = (tmp_path / "run-2.log").read_text(errors="replace")
    assert "skipped: key {'id': 1.0} is not a value of id (integer)" in text, text[-4000:]
    assert "skipped: key {'id': 'abc'} is not a value of id (integer)" in text, text[-4000:]
    assert _equal(db, tmp_path, "s")
    assert not _equal(db, tmp_path, "a") and not _equal(db, tmp_path, "b")
    db.execute("INSERT INTO a VALUES (100, 'after')")
    _run(config, tmp_path / "run-3.log")  # the stream goes on
    assert _rows(tmp_path, "a")[100] == (100, "after")
