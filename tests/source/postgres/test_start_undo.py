"""A failed start of ``tidemark run`` drops the slot and the publication it made, and
nothing another pipeline made: two runs that start together on one slot both find it
absent; the one refused (the other holds the slot) must not drop the other's slot or
publication."""

from __future__ import annotations

import contextlib

from conftest import Database
from tidemark.source.postgres import slot_holder
from tidemark.source.postgres import wal_reads as wal
from tidemark.source.postgres.start_undo import note_before_start


def _slots(db: Database) -> list[str]:
    return [r[0] for r in db.query("SELECT slot_name FROM pg_replication_slots "
                                   "WHERE database = current_database()")]


def _publications(db: Database) -> list[str]:
    return [r[0] for r in db.query("SELECT pubname FROM pg_publication")]


def test_a_failed_start_keeps_what_a_running_pipeline_made(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    slot, publication = f"s_{db.name}", f"p_{db.name}"
    undo = note_before_start(db.dsn, slot, publication)
    # Another pipeline, started at the same moment, makes both and runs (its driver
    # holds the slot's advisory lock: it never streams from the slot itself).
    with contextlib.closing(wal.connect(db.dsn, purpose="other")) as other:
        other.autocommit = True
        other.execute(f"CREATE PUBLICATION {publication} FOR TABLE t")
        slot_holder.claim(other, slot, "slot")
        wal.ensure_slot(other, slot)
        assert undo() == []
        assert slot in _slots(db)
        assert publication in _publications(db)


def test_a_failed_start_drops_what_it_made(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    slot, publication = f"s_{db.name}", f"p_{db.name}"
    undo = note_before_start(db.dsn, slot, publication)
    with contextlib.closing(wal.connect(db.dsn, purpose="this")) as mine:
        mine.autocommit = True
        mine.execute(f"CREATE PUBLICATION {publication} FOR TABLE t")
        wal.ensure_slot(mine, slot)
    assert sorted(undo()) == [f"publication {publication}", f"replication slot {slot}"]
    assert slot not in _slots(db)
    assert publication not in _publications(db)
