"""A reader ends a holder of its slot only if that holder is one of its own earlier
backends, named by PID and start: another process that got an old PID (PIDs start low
again after a server restart) is refused, never ended."""

from __future__ import annotations

import contextlib

import pytest

from conftest import Database
from tidemark.source.postgres import slot_holder
from tidemark.source.postgres import wal_reads as wal


def test_a_reused_pid_is_not_ended_as_ones_own(db: Database) -> None:
    slot = f"s_{db.name}"
    with contextlib.closing(wal.connect(db.dsn, purpose="other")) as other, \
            contextlib.closing(wal.connect(db.dsn, purpose="this")) as mine:
        slot_holder.claim(other, slot, "slot")
        pid = other.info.backend_pid
        started = slot_holder.backend_start(other)
        # An earlier backend of this reader had the same PID, at another time.
        earlier = {pid: str(float(started) - 3600)}
        with pytest.raises(slot_holder.SlotHeldError):
            slot_holder.wait_until_free(mine, slot, "slot", 0.5, own=earlier)
        assert other.execute("SELECT 1").fetchone() == (1,)  # still alive
        assert slot_holder.holder(mine, slot) == pid
        # Its own earlier backend (PID and start) is ended.
        slot_holder.wait_until_free(mine, slot, "slot", 5.0, own={pid: started})
        assert slot_holder.holder(mine, slot) is None
