"""Walk a partition's pgoutput messages and hand whole-transaction row changes to a sink.

The walk keeps only the transactions whose commit LSN lies in the partition's range
(:func:`tidemark.spark.offsets.in_batch`); a transaction outside it costs one look at
each message's type byte. Relation messages are tracked everywhere, also inside skipped
transactions, because the server sends a table's Relation message only before the first
change to it in a decoding session.

Row changes follow the typed-table contract shared with ``apply_changes``:

* ``c`` insert, ``u`` update (the new row), ``d`` delete (the old row as the server sent
  it: at least the key columns; the whole row with ``REPLICA IDENTITY FULL``), ``t``
  truncate (one row per truncated table, all columns null);
* an update that changes the primary key becomes ``d`` of the old key, then ``c`` of the
  new row;
* ``seq`` numbers the rows of a transaction from 1 in commit order (a key change uses
  two numbers).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from tidemark.source.postgres import pgoutput
from tidemark.source.postgres.pgoutput import Relation, TupleData

_BEGIN = 0x42
_COMMIT = 0x43
_RELATION = 0x52
_INSERT = 0x49
_UPDATE = 0x55
_DELETE = 0x44
_TRUNCATE = 0x54
_NEW_TUPLE = 0x4E  # 'N': an Update's tuple is its new row (no old row precedes it)


class RowSink(Protocol):
    """Receives decoded row changes; builds whatever the stream emits (Arrow batches)."""

    def relation(self, rel: Relation) -> None:
        """A table's (new) column layout; later rows of ``rel.relation_id`` use it."""

    def begin(self, commit_lsn: int, commit_ts_us: int, xid: int) -> None:
        """The rows that follow belong to this transaction."""

    def raw(self, data: bytes, op: str, lsn: int, seq: int) -> None:
        """One row change still encoded: an Insert (``c``), a Delete (``d``) or an Update
        that carries only its new row (``u``), laid out as
        :mod:`tidemark.spark.tuple_columns` expects. Same meaning as :meth:`add`."""

    def add(self, relation_id: int, op: str, values: TupleData | None, lsn: int, seq: int,
            may_have_toast: bool, old: TupleData | None) -> None:
        """One row change. *values* are wire values in the relation's column order
        (None for a truncate); *may_have_toast* is true for rows from updates, the only
        ones that can carry unchanged-TOAST markers; *old* is an update's old row when
        the server sent one (``REPLICA IDENTITY FULL``)."""


class TransactionWalker:
    """Feeds the row changes of transactions committing in ``[lo, hi)`` to a sink.

    Call :meth:`feed` with consecutive chunks of ``(lsn, pgoutput message)`` rows in
    server order; a transaction may span chunks.
    """

    def __init__(self, lo: int, hi: int, sink: RowSink) -> None:
        self.lo = lo
        self.hi = hi
        self.sink = sink
        self.keys: dict[int, tuple[int, ...]] = {}
        self.skipping = True  # outside a transaction, or inside one of another range
        self.seq = 0
        self.rows = 0
        """Rows handed to the sink so far."""

    def feed(self, chunk: Iterable[tuple[int, bytes]]) -> None:
        """Decode one chunk of messages."""
        # Hot loop: state in locals, stored back at the end.
        lo, hi, sink, keys = self.lo, self.hi, self.sink, self.keys
        skipping, seq, rows = self.skipping, self.seq, self.rows
        parse_update = pgoutput.parse_update
        add = sink.add
        raw = sink.raw
        for lsn, data in chunk:
            kind = data[0]
            if kind == _INSERT:
                if not skipping:
                    seq += 1
                    rows += 1
                    raw(data, "c", lsn, seq)
                continue
            if kind == _UPDATE and len(data) > 5 and data[5] == _NEW_TUPLE:
                if not skipping:
                    seq += 1
                    rows += 1
                    raw(data, "u", lsn, seq)
                continue
            if kind == _DELETE:
                if not skipping:
                    seq += 1
                    rows += 1
                    raw(data, "d", lsn, seq)
                continue
            if kind == _RELATION:
                rel = pgoutput.parse_relation(data)
                keys[rel.relation_id] = tuple(i for i, c in enumerate(rel.columns) if c.is_key)
                sink.relation(rel)
                continue
            if kind == _BEGIN:
                begin = pgoutput.parse_begin(data)
                skipping = not (lo <= begin.final_lsn < hi)
                if not skipping:
                    sink.begin(begin.final_lsn, begin.commit_ts, begin.xid)
                    seq = 0
                continue
            if skipping:
                continue
            if kind == _UPDATE:  # with an old row: the key may have changed
                upd = parse_update(data)
                old = upd.old
                key = keys.get(upd.relation_id, ())
                if old is not None and key and any(old[i] != upd.new[i] for i in key):
                    seq += 1
                    add(upd.relation_id, "d", old, lsn, seq, False, None)
                    seq += 1
                    add(upd.relation_id, "c", upd.new, lsn, seq, True, None)
                    rows += 1
                else:
                    seq += 1
                    add(upd.relation_id, "u", upd.new, lsn, seq, True, old)
            elif kind == _TRUNCATE:
                trunc = pgoutput.parse_truncate(data)
                for relation_id in trunc.relation_ids:
                    seq += 1
                    add(relation_id, "t", None, lsn, seq, False, None)
                rows += len(trunc.relation_ids) - 1
            elif kind == _COMMIT:
                skipping = True
                continue
            else:
                continue  # Origin, Type, logical decoding messages: nothing to emit
            rows += 1
        self.skipping, self.seq, self.rows = skipping, seq, rows
