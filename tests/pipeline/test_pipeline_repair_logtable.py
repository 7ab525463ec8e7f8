"""``tidemark-repair`` through ``tidemark run`` on CDC log tables (PostgreSQL and SQLite):
a target tampered with behind the pipeline's back (a row deleted, a value changed, a
row the source lacks added) equals its source again after a repair signal for those
keys; only those keys are written, the signal is applied once across a crash after its
batch was read, and an SCD2 history gets one new version per changed key and none for
an unchanged one (the model: test_pipeline_repair.py, PostgreSQL's WAL)."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from delta_rows import live_table
from logtable_helpers import LogDb
from pipeline_helpers import _batch_lines, _tidemark_run
from tidemark.errors import SourceError
from tidemark.event import TableId
from tidemark.pipeline.compare import compare
from tidemark.source.repair_signal import repair_signal_data
from tidemark.source.signals import SignalError, send_signal, signal_table_ddl
from tidemark.spark_checkpoint import last_batch

pytestmark = pytest.mark.integration

TABLES = ("a", "b", "s")
KEYS = [{"id": 3}, {"id": 5}, {"id": 7}, {"id": 999}]


@pytest.fixture(params=["postgres", "sqlite"])
def logdb(request: pytest.FixtureRequest, tmp_path: Path) -> LogDb:
    if request.param == "sqlite":
        path = tmp_path / "app.db"
        path.touch()
        return LogDb("sqlite", f"sqlite:///{path}", path)
    return LogDb("postgres", request.getfixturevalue("db").dsn)


def _schema(db: LogDb) -> str:
    return "main" if db.kind == "sqlite" else "public"


def _config(tmp_path: Path, db: LogDb) -> Path:
    schema = _schema(db)
    kind = "" if db.kind == "sqlite" else 'kind = "logtable"\n'
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[source]\ndsn = "{db.dsn}"\n{kind}signal_table = "{schema}.dbz_signal"\n'
        '[spark]\ncheckpoint = "chk"\navailable_now = true\nmaster = "local[1]"\n'
        'conf = { "spark.ui.enabled" = "false", "spark.sql.shuffle.partitions" = "1" }\n'
        f'[targets."{schema}.a"]\npath = "lake/a"\nkeys = ["id"]\nsnapshot = "never"\n'
        f'[targets."{schema}.b"]\npath = "lake/b"\nkeys = ["id"]\nsnapshot = "never"\n'
        "stored_as_scd_type = 2\n"
        f'[targets."{schema}.s"]\npath = "lake/s"\nkeys = ["id"]\nsnapshot = "never"\n'
        'soft_delete_column = "deleted"\n')
    return file


def _loaded(db: LogDb, tmp_path: Path) -> Path:
    """The signal table and TABLES (rows 1..20) with their log tables, applied once by
    a first run; the pipeline file."""
    db.execute(signal_table_ddl(TableId(_schema(db), "dbz_signal")),
               *(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)" for t in TABLES))
    db.install(list(TABLES))
    config = _config(tmp_path, db)
    db.execute(*(f"INSERT INTO {t} (id, v) VALUES "
                 + ", ".join(f"({i}, '{t}{i}')" for i in range(1, 21)) for t in TABLES))
    _run(config, tmp_path / "run-1.log")
    return config


def _run(config: Path, log: Path, fault: str | None = None) -> list[str]:
    proc = _tidemark_run(config, log, extra_env={"TIDEMARK_FAULT": fault} if fault else None)
    code = proc.wait(300)
    text = log.read_text(errors="replace")
    assert code == (-signal.SIGKILL if fault else 0), text[-4000:]
    return _batch_lines(log)


def _equal(db: LogDb, tmp_path: Path, table: str) -> bool:
    path = str(tmp_path / "lake" / table)
    if table == "s":  # soft-deleted rows are marked, not gone
        rows = live_table(DeltaTable(path))
        live = rows.filter(pc.invert(pc.fill_null(rows.column("deleted"), False)))
        found = sorted(zip(live.column("id").to_pylist(), live.column("v").to_pylist(),
                           strict=True))
        return found == sorted(db.query("SELECT id, v FROM s"))
    source, lake = compare(db.dsn, f"{_schema(db)}.{table}", path, ["id", "v"],
                           scd2=table == "b")
    return bool(source == lake)


def _counts(line: str) -> dict[str, int]:
    """A batch line's changes per table (``batch 3: public.a +4, public.b +1 | …``)."""
    tables = line.split(":", 1)[1].split("|", maxsplit=1)[0]
    return {name: int(count) for name, count in
            (part.strip().rsplit(" +", 1) for part in tables.split(","))}


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


def _current_start(tmp_path: Path, key: int) -> set[object]:
    return {r["__START_AT"] for r in live_table(DeltaTable(str(tmp_path / "lake/b")))
            .to_pylist() if r["id"] == key and r["__END_AT"] is None}


def test_a_repair_signal_mends_tampered_log_table_targets_once_across_a_crash(
        logdb: LogDb, tmp_path: Path) -> None:
    db, schema = logdb, _schema(logdb)
    config = _loaded(db, tmp_path)
    assert all(_equal(db, tmp_path, t) for t in TABLES)

    _tamper(tmp_path)
    assert not any(_equal(db, tmp_path, t) for t in TABLES)
    before = _versions(tmp_path)
    tampered = {t: _rows(tmp_path, t) for t in ("a", "s")}
    start_of_7 = _current_start(tmp_path, 7)
    db.execute(*(f"UPDATE {t} SET v = 'streamed' WHERE id = 8" for t in TABLES))
    for table in TABLES:
        send_signal(db.dsn, f"{schema}.dbz_signal", "tidemark-repair",
                    repair_signal_data(f"{schema}.{table}", KEYS))

    # Killed after the batch that takes the signals was read, before Delta has any of it.
    batch = (last_batch(tmp_path / "chk" / "offsets") or 0) + 1
    _run(config, tmp_path / "run-2.log", f"after_read:{batch}")
    lines = _run(config, tmp_path / "run-3.log")
    assert all(_equal(db, tmp_path, t) for t in TABLES)
    # The replayed batch holds the stream's change (key 8); its repair rows were read
    # by the killed run at that batch's end, so the next batch reads them again at its
    # own: 3 r + 1 d per table, once.
    moved = [line for line in lines if "no changes" not in line]
    assert [line.split(":", 1)[0] for line in moved] == [f"batch {batch}",
                                                        f"batch {batch + 1}"], lines
    assert [_counts(line) for line in moved] == [
        {f"{schema}.{t}": 1 for t in TABLES}, {f"{schema}.{t}": 4 for t in TABLES}], lines

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
    assert _current_start(tmp_path, 7) == start_of_7


def test_a_log_table_signal_table_is_written_and_checked(logdb: LogDb) -> None:
    """``send_signal`` writes into the log tables' database or file; a missing signal
    table is named with its CREATE TABLE, at the stream's start and when writing."""
    from tidemark.source.logtable.signal_table import (  # noqa: PLC0415
        check_signal_table,
        signal_rows,
    )

    table = TableId(_schema(logdb), "dbz_signal")
    with pytest.raises(SourceError, match="does not exist; create it with: CREATE TABLE"):
        check_signal_table(logdb.dsn, table)
    with pytest.raises(SignalError, match=r"does not exist.*create it with: CREATE TABLE"):
        send_signal(logdb.dsn, table, "log", {"message": "hello"})
    logdb.execute(signal_table_ddl(table))
    check_signal_table(logdb.dsn, table)
    sent = send_signal(logdb.dsn, table, "tidemark-repair",
                       repair_signal_data(f"{table.schema}.t", [{"id": 1}]))
    assert [row[:2] for row in signal_rows(logdb.dsn, table)] == [(sent, "tidemark-repair")]
    with pytest.raises(SignalError, match="already"):
        send_signal(logdb.dsn, table, "log", {"message": "again"}, signal_id=sent)
    if logdb.kind == "sqlite":
        with pytest.raises(SignalError, match=r"name it main\.dbz_signal"):
            send_signal(logdb.dsn, "public.dbz_signal", "log", {"message": "hello"})


def test_a_repair_key_the_source_cannot_read_is_skipped_not_fatal(
        logdb: LogDb, tmp_path: Path) -> None:
    """``1.5`` and ``"abc"`` for an integer key: the signal is skipped with a warning
    naming the key and the column's type when taken; the stream goes on, and a good
    signal in the same batch is applied."""
    db, schema = logdb, _schema(logdb)
    config = _loaded(db, tmp_path)
    _tamper(tmp_path)
    send_signal(db.dsn, f"{schema}.dbz_signal", "tidemark-repair",
                repair_signal_data(f"{schema}.a", [{"id": 1.5}]))
    send_signal(db.dsn, f"{schema}.dbz_signal", "tidemark-repair",
                repair_signal_data(f"{schema}.b", [{"id": "abc"}]))
    send_signal(db.dsn, f"{schema}.dbz_signal", "tidemark-repair",
                repair_signal_data(f"{schema}.s", KEYS))
    _run(config, tmp_path / "run-2.log")
    text = (tmp_path / "run-2.log").read_text(errors="replace")
    assert "skipped: key {'id': 1.5} is not a value of id" in text, text[-4000:]
    assert "skipped: key {'id': 'abc'} is not a value of id" in text, text[-4000:]
    assert _equal(db, tmp_path, "s")
    assert not _equal(db, tmp_path, "a") and not _equal(db, tmp_path, "b")
    db.execute("INSERT INTO a (id, v) VALUES (100, 'after')")
    _run(config, tmp_path / "run-3.log")  # the stream goes on
    assert _rows(tmp_path, "a")[100] == (100, "after")
