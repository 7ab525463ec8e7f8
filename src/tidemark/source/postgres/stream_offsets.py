"""Offsets of the Spark source and how a micro-batch's WAL range is cut.

An offset is a WAL position ``L`` (kept in Spark's checkpoint as ``{"lsn": "16/B374D848"}``)
meaning "every transaction whose commit record starts before ``L`` has been read". A
micro-batch ``[start, end)`` therefore holds exactly the transactions whose **commit LSN**
(the ``final_lsn`` of their Begin message) is in ``start <= commit_lsn < end``: whole
transactions only, and the same ones however often the range is read, because commit
LSNs never change. A transaction that began before ``start`` but commits after it belongs
to this batch in full, even though some of its changes have lower LSNs.

The same rule cuts a batch into partitions: the range is split at arbitrary WAL
positions and each partition reads the transactions committing in its slice, so the
split needs no knowledge of where transactions are.

Everything here is pure; the functions that ask the server live in
:mod:`tidemark.source.postgres.wal_reads`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tidemark.errors import TerminalError
from tidemark.source.postgres.pgoutput import lsn_to_str, str_to_lsn
from tidemark.source.postgres.repair_hold import RepairHold
from tidemark.source.postgres.snapshot_plan import SnapshotPlan
from tidemark.source.repair import requests_from


class OffsetError(TerminalError):
    """A checkpointed offset that is not one of ours (a checkpoint of another source?)."""


def to_offset(lsn: int) -> dict[str, str]:
    """The checkpoint form of *lsn*."""
    return {"lsn": lsn_to_str(lsn)}


def from_offset(offset: Mapping[str, Any]) -> int:
    """The LSN of a checkpointed offset."""
    text = offset.get("lsn") if isinstance(offset, Mapping) else None
    if not isinstance(text, str):
        raise OffsetError(f"offset {offset!r} is not a tidemark offset ({{'lsn': '0/0'}}): "
                          "was the checkpoint written by another source?")
    try:
        return str_to_lsn(text)
    except ValueError as err:
        raise OffsetError(f"offset {offset!r}: {err}") from None


@dataclasses.dataclass(frozen=True)
class SourceOffset:
    """The whole offset: the stream's LSN and the snapshot state around it.

    ``known`` are the tables the query has taken in (snapshotted, or streamed without a
    snapshot); None in a checkpoint written before snapshots existed, whose tables are
    all known. ``skip`` maps a table to the consistent point of its snapshot: its
    changes committing before it are in the snapshot and are dropped from the stream.
    """

    lsn: int
    known: tuple[str, ...] | None = None
    skip: Mapping[str, int] = dataclasses.field(default_factory=dict)
    snapshot: SnapshotPlan | None = None
    signals: tuple[str, ...] | None = None
    """Ids of the signal table's rows already taken (None: never read)."""
    held: RepairHold | None = None
    """``tidemark-repair`` requests waiting for the stream to reach their snapshot's
    point (:mod:`tidemark.source.postgres.repair_hold`)."""
    repairs: RepairHold | None = None
    """The requests the batch ending here takes (it ends at their point)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = to_offset(self.lsn)
        if self.known is not None:
            out["known"] = list(self.known)
        if self.skip:
            out["skip"] = {t: lsn_to_str(at) for t, at in sorted(self.skip.items())}
        if self.snapshot is not None:
            out["snapshot"] = self.snapshot.to_json()
        if self.signals is not None:
            out["signals"] = list(self.signals)
        if self.held is not None:
            out["held"] = self.held.to_json()
        if self.repairs is not None:
            out["repairs"] = self.repairs.to_json()
        return out

    @classmethod
    def parse(cls, offset: Mapping[str, Any]) -> SourceOffset:
        lsn = from_offset(offset)
        try:
            known = offset.get("known")
            skip = offset.get("skip") or {}
            plan = offset.get("snapshot")
            signals = offset.get("signals")
            held, repairs = _repair_state(lsn, offset)
            return cls(lsn=lsn,
                       signals=None if signals is None else tuple(str(s) for s in signals),
                       known=None if known is None else tuple(str(t) for t in known),
                       skip={str(t): str_to_lsn(str(at)) for t, at in skip.items()},
                       snapshot=None if plan is None else SnapshotPlan.from_json(plan),
                       held=held, repairs=repairs)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise OffsetError(f"offset {offset!r} has a malformed snapshot state ({err}): "
                              "was the checkpoint written by another source?") from None


def _repair_state(lsn: int, offset: Mapping[str, Any]
                  ) -> tuple[RepairHold | None, RepairHold | None]:
    """The held and taken repairs of *offset*. A checkpoint written before repairs were
    held keeps the batch's taken requests as a list, read on the executor at no
    exported snapshot: they are held again (no export: the next step takes a new one
    and reads them exactly at its point; reading a repair twice is idempotent)."""
    held = RepairHold.from_json(offset.get("held"))
    repairs = offset.get("repairs")
    if not isinstance(repairs, list):
        return held, RepairHold.from_json(repairs)
    old = requests_from(repairs)
    if not old:
        return held, None
    if held is None:
        return RepairHold(lsn, "", old), None
    return dataclasses.replace(held, requests=(*old, *held.requests)), None


@dataclasses.dataclass(frozen=True)
class TxnSummary:
    """One committed transaction as a scan of the slot sees it."""

    commit_lsn: int
    changes: int


def in_batch(commit_lsn: int, lo: int, hi: int) -> bool:
    """Whether a transaction committing at *commit_lsn* belongs to the range ``[lo, hi)``."""
    return lo <= commit_lsn < hi


def end_for_limit(txns: Iterable[TxnSummary], start: int, max_changes: int) -> int | None:
    """The end of a batch from *start* holding at most *max_changes* changes.

    Whole transactions in commit order; the first transaction is always taken, however
    large, so a transaction bigger than the limit still makes progress. None when
    *txns* has no transaction committing at or after *start*.
    """
    end: int | None = None
    total = 0
    for txn in sorted(txns, key=lambda t: t.commit_lsn):
        if txn.commit_lsn < start:
            continue
        if end is not None and total + txn.changes > max_changes:
            break
        total += txn.changes
        end = txn.commit_lsn + 1
    return end


def split_range(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """Cut ``[start, end)`` into at most *parts* adjacent, non-empty WAL slices.

    Slices are equal in bytes of WAL: with commit-LSN assignment any cut point is
    correct, and bytes of WAL are a fair measure of decoding work.
    """
    if end <= start:
        return []
    parts = max(1, min(parts, end - start))
    step, extra = divmod(end - start, parts)
    slices = []
    lo = start
    for i in range(parts):
        hi = lo + step + (1 if i < extra else 0)
        slices.append((lo, hi))
        lo = hi
    return slices


@dataclasses.dataclass
class TxnIndex:
    """What the driver learnt from its last scan of the slot, for admission control.

    ``txns`` are every transaction committing in ``[lo, hi)``: commit LSNs are facts
    that never change, so later batches inside that range are planned without asking
    the server again.
    """

    lo: int = 0
    hi: int = 0
    txns: Sequence[TxnSummary] = ()

    def covers(self, start: int) -> bool:
        return self.lo <= start < self.hi

    def changes_after(self, start: int) -> int:
        return sum(t.changes for t in self.txns if t.commit_lsn >= start)

    def plan(self, start: int, max_changes: int) -> int | None:
        """The batch end from *start* if this index can decide it, else None.

        It can when the transactions it knows after *start* hold more than the limit
        (the batch is full), or when it knows everything up to its end.
        """
        end = end_for_limit(self.txns, start, max_changes)
        if end is None:
            return None
        if self.changes_after(start) > max_changes:
            return end
        return None
