"""Before ``tidemark run`` starts Spark on a PostgreSQL checkpoint: its slot must be
the one the checkpoint has been reading.

The Spark source advances the slot only after Spark committed a batch, so the slot is
never past the checkpoint's last committed offset. A slot that is (or none at all) was
dropped, and made again, while the pipeline was stopped: the changes in between were
never read and cannot be. Spark would find that out at the first batch, behind a
stack trace; this says it before anything starts, with the way out.
"""

from __future__ import annotations

import contextlib
import logging

import psycopg

from tidemark.errors import SourceUnavailableError, first_line
from tidemark.source.postgres import slot_holder
from tidemark.source.postgres import wal_reads as wal
from tidemark.source.postgres.pgoutput import lsn_to_str
from tidemark.source.postgres.slot import SlotLostError
from tidemark.source.postgres.stream_offsets import SourceOffset
from tidemark.spark_checkpoint import committed_source_offset

log = logging.getLogger(__name__)

_REPAIR = ("To repair the targets, move the checkpoint directory aside and run again with a "
           "new one: with snapshot = \"initial\" (the default) every target is then loaded "
           "anew from a snapshot, which replaces its rows, so rows changed or deleted while "
           "the slot was gone are right again (SCD type 2 targets get new versions where "
           "rows differ)")


def check_slot_vouched(dsn: str, slot: str, checkpoint: str) -> None:
    """Raise :class:`SlotLostError` if *slot* is missing or past the last batch the
    *checkpoint* committed; nothing if the checkpoint has committed no batch."""
    _, batch, raw = committed_source_offset(checkpoint)
    if batch is None or raw is None:
        return
    reached = SourceOffset.parse(raw).lsn
    try:
        with contextlib.closing(wal.connect(dsn, purpose="driver")) as conn:
            row = conn.execute("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM "
                               "pg_replication_slots WHERE slot_name = %s",
                               (slot,)).fetchone()
    except (psycopg.OperationalError, SourceUnavailableError) as err:
        # Unreachable now: the query's own start reports it (and retries).
        log.warning("could not check replication slot %s before the start: %s", slot,
                    first_line(err))
        return
    if row is None:
        raise SlotLostError(
            f"replication slot {slot!r} is gone but the checkpoint {checkpoint} had reached "
            f"{lsn_to_str(reached)} (batch {batch}): the changes since then are lost to "
            f"this checkpoint. {_REPAIR}")
    position = row[0]
    if position is not None and int(position) > reached:
        raise SlotLostError(
            f"replication slot {slot!r} is at {lsn_to_str(int(position))}, past "
            f"{lsn_to_str(reached)} where the checkpoint {checkpoint} got to (batch {batch}): "
            "this pipeline never advanced it there, so it is not the slot the checkpoint "
            "was reading (it was dropped and made again), and the changes in between were "
            f"never read. {_REPAIR}")


def check_slot_free(dsn: str, slot: str) -> None:
    """Raise :class:`~tidemark.source.postgres.slot_holder.SlotHeldError` if another
    process streams from *slot* or holds it (another pipeline, a capture, an engine)."""
    try:
        with contextlib.closing(wal.connect(dsn, purpose="driver")) as conn:
            slot_holder.wait_until_free(conn, slot, "source.slot")
    except (psycopg.OperationalError, SourceUnavailableError) as err:
        log.warning("could not check replication slot %s before the start: %s", slot,
                    first_line(err))
