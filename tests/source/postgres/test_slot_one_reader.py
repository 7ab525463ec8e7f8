"""One slot, one reader: a second capture (or stream) on a slot another process reads
is refused at its start, in one line naming the slot and the process, and the first
goes on losing nothing."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import Database
from tidemark.source.postgres import slot_holder
from tidemark.source.postgres import wal_reads as wal
from waiting import wait_for


def _capture(db: Database, tmp: Path, name: str, slot: str) -> tuple[subprocess.Popen[bytes],
                                                                      Path, Path]:
    out, err = tmp / f"{name}.jsonl", tmp / f"{name}.stderr"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidemark", "capture", "--table", "public.t",
             "--slot", slot, "--publication", f"p_{db.name}"],
            stdout=o, stderr=e, env={**os.environ, "TIDEMARK_DSN": db.dsn})
    return proc, out, err


def _ids(out: Path) -> list[int]:
    return [json.loads(line)["value"]["after"]["id"]
            for line in out.read_text().splitlines() if line.strip()]


def _holder(db: Database, slot: str) -> int | None:
    rows = db.query("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                    (slot,))
    return rows[0][0] if rows else None


def test_second_capture_on_a_slot_is_refused_at_start(
        db: Database, tmp_path: Path, kill_on_exit: list[subprocess.Popen[bytes]]) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    slot = f"s_{db.name}"
    first, first_out, _ = _capture(db, tmp_path, "first", slot)
    kill_on_exit.append(first)
    wait_for(lambda: _ids(first_out) == [1], 60, "the first capture's snapshot")
    pid = wait_for(lambda: _holder(db, slot), 30, "the first capture to hold the slot")

    began = time.monotonic()
    second, second_out, second_err = _capture(db, tmp_path, "second", slot)
    kill_on_exit.append(second)
    code = second.wait(timeout=60)
    took = time.monotonic() - began

    assert code != 0
    errors = [line for line in second_err.read_text().splitlines() if line.strip()]
    assert len(errors) == 1, errors  # one line, no traceback
    assert f"replication slot '{slot}'" in errors[0]
    assert f"PID {pid}" in errors[0]
    assert "--slot" in errors[0]
    assert second_out.read_text() == ""  # nothing delivered, nothing taken
    assert took < 20, took
    # The first goes on, and loses nothing.
    db.execute("INSERT INTO t VALUES (2)", "INSERT INTO t VALUES (3)")
    wait_for(lambda: _ids(first_out) == [1, 2, 3], 30, "the first capture's changes")
    assert first.poll() is None


def test_stream_driver_claims_its_slot(db: Database) -> None:
    """The Spark stream's driver holds its slot while it runs (it streams from copies,
    so the slot itself is not active): a capture or a second stream is refused."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    slot = f"s_{db.name}"
    with contextlib.closing(wal.connect(db.dsn, purpose="test")) as conn:
        wal.ensure_slot(conn, slot)
        slot_holder.claim(conn, slot, "slot")
        mine = conn.info.backend_pid
        with contextlib.closing(wal.connect(db.dsn, purpose="test")) as other:
            with pytest.raises(slot_holder.SlotHeldError, match=f"PID {mine}"):
                slot_holder.claim(other, slot, "slot", wait_s=0.5)
            with pytest.raises(slot_holder.SlotHeldError, match=f"'{slot}'"):
                slot_holder.wait_until_free(other, slot, "slot", wait_s=0.5)
    # Its session gone, the slot is free again.
    with contextlib.closing(wal.connect(db.dsn, purpose="test")) as conn:
        wait_for(lambda: slot_holder.holder(conn, slot) is None, 10, "the claim to end")
        slot_holder.claim(conn, slot, "slot", wait_s=0.5)


@pytest.mark.parametrize("attempts", [10, 0], ids=["reader-reconnects", "engine-reopens"])
def test_engine_reconnects_after_a_cut_while_its_old_walsender_lingers(
        db: Database, caplog: pytest.LogCaptureFixture, attempts: int) -> None:
    """A network cut leaves the reader's walsender active on the server (until
    wal_sender_timeout): the reconnecting reader (the same one, or with
    reconnect_max_attempts = 0 a new one the engine opens) is not refused by its own
    old connection, and streaming goes on without loss."""
    from tcp_cut import CuttableRelay  # noqa: PLC0415
    from tidemark.engine.converters import EventConverter  # noqa: PLC0415
    from tidemark.engine.engine import Engine  # noqa: PLC0415
    from tidemark.engine.state import State  # noqa: PLC0415
    from tidemark.event import ChangeEvent  # noqa: PLC0415
    from tidemark.source.postgres.task import PostgresConnector  # noqa: PLC0415
    from tidemark.testing.sink import MemorySink  # noqa: PLC0415

    def delivered() -> set[int]:
        return {int(r.value.after["id"]) for r in sink.records
                if isinstance(r.value, ChangeEvent) and r.value.after is not None}

    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    slot = f"s_{db.name}"
    params = dict(item.split("=", 1) for item in db.dsn.split())
    with CuttableRelay(params["host"], int(params["port"])) as relay:
        sink = MemorySink()
        engine = Engine(PostgresConnector({
            "dsn": relay.dsn(db.dsn), "slot_name": slot, "publication_name": f"p_{db.name}",
            "table_include_list": ["public.t"], "reconnect_backoff_ms": 100,
            "reconnect_max_attempts": attempts}), sink, config={
            "errors_max_retries": -1, "errors_retry_delay_initial_ms": 100,
            "errors_retry_delay_max_ms": 200}, converter=EventConverter())
        thread = threading.Thread(target=engine.run, daemon=True)
        thread.start()
        try:
            wait_for(lambda: delivered() == {1}, 60, "the snapshot")
            db.execute("INSERT INTO t VALUES (2)")
            wait_for(lambda: delivered() == {1, 2}, 30, "the first change")
            old = wait_for(lambda: _holder(db, slot), 30, "the walsender")
            assert relay.cut() > 0
            caplog.set_level(logging.INFO, logger="tidemark.source.postgres.slot_holder")
            db.execute("INSERT INTO t VALUES (3)")
            wait_for(lambda: delivered() == {1, 2, 3}, 60, "the change after the cut")
            new = wait_for(lambda: _holder(db, slot), 30, "the new walsender")
            assert new != old
            # The old walsender outlived the cut (its side of the connection stayed
            # open): the reader ended it as its own.
            assert f"(PID {old}, whose client side broke)" in caplog.text
            db.execute("INSERT INTO t VALUES (4)")
            wait_for(lambda: delivered() == {1, 2, 3, 4}, 30, "the next change")
            assert engine.error is None and engine.state is State.POLLING_TASKS, engine.error
        finally:
            engine.close()
            thread.join(30)
    assert engine.error is None, engine.error


def test_stream_driver_reclaims_its_slot_after_its_connection_broke(db: Database) -> None:
    """The Spark driver's connection breaks (a network cut): the server keeps the old
    backend, and its claim, for a while. The driver's new connection claims the slot
    anyway (the old backend is its own, and is ended), instead of being refused."""
    from tcp_cut import CuttableRelay  # noqa: PLC0415
    from tidemark.source.postgres.read_plan import PostgresReadPlan  # noqa: PLC0415
    from tidemark.spark.options import SourceOptions  # noqa: PLC0415

    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    slot = f"s_{db.name}"
    params = dict(item.split("=", 1) for item in db.dsn.split())
    with CuttableRelay(params["host"], int(params["port"])) as relay:
        plan = PostgresReadPlan(SourceOptions.parse(
            {"dsn": relay.dsn(db.dsn), "table": "public.t", "slot": slot,
             "publication": f"p_{db.name}"}))
        plan.initial_offset()
        with contextlib.closing(wal.connect(db.dsn, purpose="test")) as watcher:
            old = slot_holder.holder(watcher, slot)
            assert old is not None
            assert relay.cut() > 0
            assert plan._conn is not None
            plan._conn.close()  # what a broken connection comes to
            assert slot_holder.holder(watcher, slot) == old  # the server kept it
            plan.initial_offset()
            new = slot_holder.holder(watcher, slot)
            assert new is not None and new != old
