"""Incremental snapshots beside a transaction its chunk's snapshot neither sees nor lists
as running: one whose xid is at or above the snapshot's xmax."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from test_incremental_snapshot import (
    SIGNALS,
    _collect,
    _commit_held,
    _done,
    _reads,
    _rebuild,
    _setup,
    _signal,
    _snapshot_rows,
    _source,
)

from capture_helpers import drain, events, make_connector
from conftest import Database
from tidemark.source.postgres import incremental_snapshot

pytestmark = [pytest.mark.integration, pytest.mark.every_pg_version]


def test_a_change_committed_above_the_snapshots_xmax_does_not_go_stale(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer takes its xid after the opening mark's, writes its commit record before
    the mark's commit and then waits (here for a synchronous standby): the chunk's
    snapshot, taken right after the mark commits, neither sees it nor lists it (its xid
    is at or above the snapshot's xmax). Its change, streamed before the opening mark,
    must not be overwritten by the chunk's older row."""
    _setup(db, 300)
    real_send = incremental_snapshot.IncrementalSnapshot._send
    held = contextlib.ExitStack()
    steps: list[str] = []

    def send(cur: Any, sent: str) -> None:
        if "'open:" in sent and not steps:
            steps.append("open")
            mark, rest = sent.split("; COMMIT; ", 1)
            real_send(cur, mark)  # the mark's transaction has its xid, not committed yet
            held.enter_context(_commit_held(db, "UPDATE t SET v = 'new' WHERE id = 5"))
            real_send(cur, f"COMMIT; {rest}")  # the snapshot is taken right after
            return
        if "'close:" in sent and steps == ["open"]:
            steps.append("close")
            held.close()  # the chunk has been read: the writer may end
        real_send(cur, sent)

    monkeypatch.setattr(incremental_snapshot.IncrementalSnapshot, "_send", staticmethod(send))
    connector = make_connector(db.dsn, "public.t", snapshot_mode="no_data",
                               signal_table=SIGNALS, incremental_snapshot_chunk_size=100)
    connector.start()
    drain(connector, db.insert_lsn())
    try:
        _signal(db, "execute-snapshot", _snapshot_rows(db, ["public.t"]))
        got = _collect(connector, lambda r: _done(connector) and bool(r))
        end = db.insert_lsn()
        got += _collect(connector, lambda r: connector.stats.position_lsn >= end)
    finally:
        held.close()
        connector.stop()
    assert steps == ["open", "close"]
    assert [e.after["v"] for e in events(got) if e.after and e.after["id"] == 5][-1] == "new"
    assert _rebuild(got) == _source(db)
    assert {int(e.after["id"]) for e in _reads(got)} >= set(range(1, 301)) - {5}
