"""A slot of the right name that the offsets do not vouch for: never a silent gap.

Offsets are saved before the slot is confirmed to them, so the slot capture reads is
never ahead of them. One that is was made again while capture was down (by an operator
after a slot-lost error, or by a capture that died after making a replacement slot and
before saving where it starts); streaming from it would skip what was committed in
between. Capture refuses it (exit 2, naming the slot and both positions), or re-reads
(``on_slot_lost = "resnapshot"``, ``snapshot_mode = "when_needed"``); and a capture or an
engine killed right after making a replacement slot is repaired by the next start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from capture_helpers import drain, make_connector
from conftest import Database
from tidemark.event import ChangeEvent, SnapshotMarker
from tidemark.offsets.store import Offset
from tidemark.source.postgres.pgoutput import lsn_to_str
from tidemark.source.postgres.slot import SlotLostError

pytestmark = [pytest.mark.integration, pytest.mark.every_pg_version]

CHILD = Path(__file__).parents[2] / "engine_child.py"
ROWS = 110


def _setup(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)",
               f"INSERT INTO t SELECT i, 'v0' FROM generate_series(1, {ROWS}) i",
               "CREATE TABLE dbz_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL,"
               " data varchar(2048) NULL)")


def _gap(db: Database, slot: str, *, recreate: bool) -> None:
    """While capture is down: its slot goes, changes commit, and (*recreate*) a slot of
    the same name is made again, as an operator does after reading the slot-lost error."""
    db.execute(f"SELECT pg_drop_replication_slot('{slot}')")
    db.execute("UPDATE t SET v = 'gap' WHERE id <= 31", "DELETE FROM t WHERE id = 100",
               f"INSERT INTO t VALUES ({ROWS + 1}, 'gap')")
    if recreate:
        db.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")


def _replay(rows: dict[int, str | None], values: list[dict[str, Any]]) -> None:
    for value in values:
        if value["op"] == "d":
            rows.pop(value["before"]["id"], None)
        else:
            rows[value["after"]["id"]] = value["after"]["v"]


def _events_as_values(records: list[Any]) -> list[dict[str, Any]]:
    return [{"op": e.op.value, "before": e.before, "after": e.after,
             "snapshot": e.snapshot} for e in records if isinstance(e, ChangeEvent)]


def _source(db: Database) -> dict[int, str | None]:
    return {int(i): v for i, v in db.query("SELECT id, v FROM t")}


def _first_run(db: Database, slot: str) -> tuple[dict[int, str | None], Offset]:
    """Capture everything there is (a snapshot) and the offset it saved."""
    connector = make_connector(db.dsn, "public.t", slot_name=slot)
    connector.start()
    offset: Offset | None = None
    records: list[Any] = []
    try:
        target = db.insert_lsn()
        while offset is None or offset["lsn"] < target:
            batch = connector.poll()
            records += batch.records
            if batch.offset is not None:
                connector.commit(batch.offset)
                offset = batch.offset
    finally:
        connector.stop()
    replica: dict[int, str | None] = {}
    _replay(replica, _events_as_values(records))
    assert len(replica) == ROWS
    return replica, offset


@pytest.mark.parametrize("setting", ["default", "resnapshot", "when_needed"])
def test_a_slot_made_again_while_capture_was_down_is_refused_or_reread(
        db: Database, setting: str) -> None:
    _setup(db)
    slot = f"s_{db.name}"
    replica, offset = _first_run(db, slot)
    _gap(db, slot, recreate=True)
    settings = {"resnapshot": {"on_slot_lost": "resnapshot"},
                "when_needed": {"snapshot_mode": "when_needed"}}.get(setting, {})
    connector = make_connector(db.dsn, "public.t", slot_name=slot,
                               incremental_snapshot_chunk_size=50, **settings)
    if setting == "default":
        slot_at = int(db.scalar("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM "
                                "pg_replication_slots WHERE slot_name = %s", (slot,)))
        with pytest.raises(SlotLostError) as caught:
            connector.start(offset)
            connector.poll()
        connector.stop()
        message = str(caught.value)
        assert f"'{slot}'" in message and lsn_to_str(offset["lsn"]) in message
        assert lsn_to_str(slot_at) in message
        assert "resnapshot" in message and "when_needed" in message
        return
    connector.start(offset)
    records: list[Any] = []
    try:
        deadline = time.monotonic() + 60
        while sum(1 for e in _events_as_values(records) if e["op"] == "r") < ROWS or (
                connector.incremental_snapshot is not None
                and connector.incremental_snapshot.active):
            assert time.monotonic() < deadline, "the re-read did not finish"
            batch = connector.poll()
            records += batch.records
            if batch.offset is not None:
                connector.commit(batch.offset)
        records += drain(connector, db.insert_lsn(), timeout_s=60)
    finally:
        connector.stop()
    values = _events_as_values(records)
    reads = [v for v in values if v["op"] == "r"]
    assert len(reads) == ROWS  # every row re-read: 109 left and the one inserted
    if setting == "resnapshot":
        assert {v["snapshot"] for v in reads} == {SnapshotMarker.INCREMENTAL}
    _replay(replica, values)
    # A re-read repairs every row that exists; the row deleted in the gap is the one
    # thing it cannot see (docs/operations.md).
    assert {k: v for k, v in replica.items() if k != 100} == _source(db)


def _capture(db: Database, slot: str, offsets: Path, *args: str,
             fault: str | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TIDEMARK_DSN": db.dsn}
    if fault:
        env["TIDEMARK_FAULT"] = fault
    return subprocess.Popen(
        [sys.executable, "-m", "tidemark", "capture", "--table", "public.t", "--slot", slot,
         "--offsets", str(offsets), "--offset-flush-interval-ms", "0",
         "--incremental-snapshot-chunk-size", "50", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)


def _values(out: bytes) -> list[dict[str, Any]]:
    return [json.loads(line)["value"] for line in out.splitlines() if line.strip()
            and json.loads(line)["value"] is not None]


def test_capture_refuses_a_slot_made_again_with_exit_2(db: Database, tmp_path: Path) -> None:
    """The issue's reproduction: offsets saved, the slot dropped, changes, a slot of the
    same name made again, capture restarted on the saved offsets."""
    _setup(db)
    slot = f"s_{db.name}"
    offsets = tmp_path / "offsets.json"
    first = _capture(db, slot, offsets, "--stop-at-end")
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err.decode()
    _gap(db, slot, recreate=True)
    again = _capture(db, slot, offsets, "--stop-at-end")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 2, err.decode()
    assert out == b""
    message = err.decode()
    assert f"'{slot}'" in message and "resnapshot" in message, message
    assert "Traceback" not in message


@pytest.mark.parametrize("setting", ["resnapshot", "when_needed"])
def test_capture_killed_right_after_making_a_replacement_slot_repairs_on_restart(
        db: Database, tmp_path: Path, setting: str) -> None:
    _setup(db)
    slot = f"s_{db.name}"
    offsets = tmp_path / "offsets.json"
    args = ("--on-slot-lost", "resnapshot") if setting == "resnapshot" \
        else ("--snapshot-mode", "when_needed")
    first = _capture(db, slot, offsets, "--stop-at-end", *args)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err.decode()
    replica: dict[int, str | None] = {}
    _replay(replica, _values(out))
    assert len(replica) == ROWS
    _gap(db, slot, recreate=False)
    killed = _capture(db, slot, offsets, "--stop-at-end", *args,
                      fault="after_slot_created:0")
    out, err = killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, err.decode()
    assert "after_slot_created" in err.decode()
    _replay(replica, _values(out))
    assert db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                     (slot,)) == 1  # the replacement exists, its start is not saved
    again = _capture(db, slot, offsets, "--stop-at-end", *args)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err.decode()
    values = _values(out)
    assert len([v for v in values if v["op"] == "r"]) == ROWS, err.decode()
    _replay(replica, values)
    assert {k: v for k, v in replica.items() if k != 100} == _source(db)


def test_the_engine_killed_right_after_making_a_replacement_slot_repairs_on_restart(
        db: Database, tmp_path: Path) -> None:
    _setup(db)
    out = tmp_path / "out.txt"
    common = [sys.executable, str(CHILD), "--mode", "ordered", "--offsets",
              str(tmp_path / "offsets.json"), "--out", str(out), "--dsn", db.dsn,
              "--signal-table", "public.dbz_signal", "--on-slot-lost", "resnapshot"]
    first = subprocess.run([*common, "--snapshot-mode", "initial", "--stop-at-end"],
                           capture_output=True, timeout=120, check=False)
    assert first.returncode == 0, first.stderr.decode()
    replica: dict[int, str | None] = {}

    def replay_out() -> None:
        replica.clear()
        for op, key, v in (json.loads(line) for line in out.read_text().splitlines()
                           if line.endswith("]")):
            if op == "d":
                replica.pop(key, None)
            else:
                replica[key] = v

    replay_out()
    assert len(replica) == ROWS
    _gap(db, "kill_test", recreate=False)
    killed = subprocess.run([*common, "--stop-at-end"], capture_output=True, timeout=120,
                            env={**os.environ, "TIDEMARK_FAULT": "after_slot_created:0"},
                            start_new_session=True, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    again = subprocess.run([*common, "--stop-at-end"], capture_output=True, timeout=120,
                           check=False)
    assert again.returncode == 0, again.stderr.decode()
    replay_out()
    assert {k: v for k, v in replica.items() if k != 100} == _source(db)
