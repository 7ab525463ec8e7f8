"""Walk a partition's pgoutput messages and hand whole-transaction row changes to a sink.

The walk keeps only the transactions whose commit LSN lies in the partition's range
(:func:`tidemark.source.postgres.stream_offsets.in_batch`). Relation messages are tracked
everywhere, also inside skipped transactions, because the server sends a table's Relation message
only before the first change to it in a decoding session.

Row changes follow the typed-table contract shared with ``apply_changes``:

* ``c`` insert, ``u`` update (the new row), ``d`` delete (the old row as the server sent
  it: at least the key columns; the whole row with ``REPLICA IDENTITY FULL``), ``t``
  truncate (one row per truncated table, all columns null);
* an update that changes the primary key becomes ``d`` of the old key, then ``c`` of the
  new row;
* ``seq`` numbers the rows of a transaction from 1 in commit order (a key change uses
  two numbers).

The walk is vectorized per chunk (numpy over the chunk's joined bytes): which
transaction each message belongs to, whether that transaction is in range, its commit
LSN, time and id, and each row's ``seq`` are computed for all messages at once, and the
common row messages (Insert, Delete, an Update with only its new row) reach the sink as
one :class:`RowBlock` per table, still encoded (a
:class:`~tidemark.source.read_plan.EncodedRows`, decoded by
:mod:`tidemark.source.postgres.tuple_columns` where the sink wants them).
Only the rare messages are handled one by one in Python: Relation messages, updates
that carry an old row (key changes, ``REPLICA IDENTITY FULL``) and truncates.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Final, NamedTuple

import numpy as np

from tidemark.errors import DecodeError
from tidemark.event import UNAVAILABLE, WireTuple
from tidemark.key_change import key_changed
from tidemark.source.postgres import pgoutput
from tidemark.source.postgres.pgoutput import PG_EPOCH_OFFSET_US, Relation
from tidemark.source.postgres.tuple_columns import (
    TupleColumns,
    TupleLayoutError,
    decode_tuples,
    join_messages,
)
from tidemark.source.read_plan import ChangeSink, Commit

_BEGIN: Final = 0x42
_COMMIT: Final = 0x43
_RELATION: Final = 0x52
_INSERT: Final = 0x49
_UPDATE: Final = 0x55
_DELETE: Final = 0x44
_TRUNCATE: Final = 0x54
_NEW_TUPLE: Final = 0x4E  # 'N': an Update's tuple is its new row (no old row precedes it)
_BEGIN_SIZE: Final = 21

#: Row message type byte -> ``_op`` code of its row.
OP_OF_KIND: Final = {_INSERT: "c", _UPDATE: "u", _DELETE: "d"}


#: Row message type byte -> index of its op in ``("c", "u", "d")``.
_OP_INDEX: Final = np.zeros(256, np.int8)
_OP_INDEX[[_INSERT, _UPDATE, _DELETE]] = [0, 1, 2]


class RowBlock:
    """Row messages of one table still encoded, with their change columns, as arrays.

    ``buf`` holds the messages of a chunk joined (shared by the blocks of the chunk);
    message *i* of the block is ``buf[starts[i]:starts[i] + lengths[i]]``, an Insert
    (``kinds[i]`` = ``I``), a Delete (``D``) or an Update carrying only its new row
    (``U``). The other arrays hold each row's LSN, ``seq`` and transaction.
    """

    __slots__ = ("buf", "commit_lsns", "commit_ts", "kinds", "lengths", "lsns", "seqs",
                 "starts", "xids")

    def __init__(self, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                 kinds: np.ndarray, lsns: np.ndarray, seqs: np.ndarray,
                 commit_lsns: np.ndarray, commit_ts: np.ndarray, xids: np.ndarray) -> None:
        self.buf = buf
        self.starts = starts
        self.lengths = lengths
        self.kinds = kinds
        self.lsns = lsns
        self.seqs = seqs
        self.commit_lsns = commit_lsns
        self.commit_ts = commit_ts
        self.xids = xids

    def __len__(self) -> int:
        return len(self.starts)

    def select(self, which: np.ndarray) -> RowBlock:
        """The rows picked by *which* (a mask or indexes), sharing ``buf``."""
        return RowBlock(self.buf, self.starts[which], self.lengths[which], self.kinds[which],
                        self.lsns[which], self.seqs[which], self.commit_lsns[which],
                        self.commit_ts[which], self.xids[which])

    def message(self, i: int) -> bytes:
        """Row *i*'s message."""
        start = int(self.starts[i])
        return self.buf[start:start + int(self.lengths[i])].tobytes()

    def txn(self, i: int) -> Commit:
        """Row *i*'s transaction."""
        return Commit(int(self.commit_lsns[i]), int(self.commit_ts[i]), int(self.xids[i]))

    def op_indexes(self) -> np.ndarray:
        """Each row's op as an index into ``("c", "u", "d")``."""
        indexes: np.ndarray = _OP_INDEX[self.kinds]
        return indexes

    def decode(self, width: int) -> TupleColumns | None:
        """Every row's *width* columns at once (None: not the common layout)."""
        try:
            return decode_tuples(self.buf, self.starts, self.lengths, width)
        except TupleLayoutError:
            return None

    def row(self, i: int) -> tuple[str, pgoutput.TupleData, int, int, Commit]:
        """Row *i* decoded alone (exact errors for a malformed message)."""
        return (OP_OF_KIND[int(self.kinds[i])], pgoutput.parse_row(self.message(i)),
                int(self.lsns[i]), int(self.seqs[i]), self.txn(i))


def _be(buf: np.ndarray, at: np.ndarray, size: int) -> np.ndarray:
    """The big-endian unsigned integers of *size* bytes at each offset in *at*."""
    value = np.zeros(len(at), np.uint64)
    for i in range(size):
        value = (value << np.uint64(8)) | buf[at + i].astype(np.uint64)
    return value


class TransactionWalker:
    """Feeds the row changes of transactions committing in ``[lo, hi)`` to a sink.

    Call :meth:`feed` with consecutive chunks of ``(lsn, pgoutput message)`` rows in
    server order; a transaction may span chunks.
    """

    def __init__(self, lo: int, hi: int, sink: ChangeSink) -> None:
        self.lo = lo
        self.hi = hi
        self.sink = sink
        self.keys: dict[int, tuple[int, ...]] = {}
        # The transaction open at the end of the last chunk, if it is in range.
        self.txn = Commit(0, 0, 0)
        self.active = False
        self.seq = 0  # rows of self.txn so far
        self.rows = 0
        """Rows handed to the sink so far."""

    def feed(self, chunk: Sequence[tuple[int, bytes]]) -> None:
        """Decode one chunk of messages."""
        n = len(chunk)
        if n == 0:
            return
        lsn_values, messages = zip(*chunk, strict=True)  # one pass in C, not a loop
        buf, starts, lengths = join_messages(messages)
        if int(lengths.min()) == 0:
            raise DecodeError("message", 0, "empty message")
        lsns = np.array(lsn_values, np.int64)
        kinds = buf[starts]
        second = np.zeros(n, np.uint8)  # byte 5: an Update's first tuple kind
        long = lengths > 5
        second[long] = buf[starts[long] + 5]

        # Transactions: number 0 is the one open when the chunk starts.
        is_begin = kinds == _BEGIN
        begins = np.flatnonzero(is_begin)
        if len(begins) and not bool((lengths[begins] == _BEGIN_SIZE).all()):
            bad = int(begins[lengths[begins] != _BEGIN_SIZE][0])
            pgoutput.parse_begin(chunk[bad][1])  # raises the exact DecodeError
        at = starts[begins]
        final = _be(buf, at + 1, 8).astype(np.int64)
        txn_commit = np.concatenate(([self.txn.commit_lsn], final))
        txn_ts = np.concatenate(([self.txn.commit_ts_us], _be(buf, at + 9, 8).astype(np.int64)
                                 + PG_EPOCH_OFFSET_US))
        txn_xid = np.concatenate(([self.txn.xid], _be(buf, at + 17, 4).astype(np.int64)))
        txn_active = np.concatenate(([self.active], (final >= self.lo) & (final < self.hi)))
        txn_of = np.cumsum(is_begin)
        active = txn_active[txn_of]

        is_row = (kinds == _INSERT) | (kinds == _DELETE) | (kinds == _UPDATE)
        fast = is_row & ((kinds != _UPDATE) | (second == _NEW_TUPLE)) & active
        slow = ((is_row & ~fast) | (kinds == _TRUNCATE)) & active
        weights = fast.astype(np.int64)

        # The rare messages, in order: Relation messages change the layout (and the key
        # an update's old row is compared with), and a slow row's weight (rows it
        # becomes) is known only once it is decoded.
        special = np.flatnonzero((kinds == _RELATION) | slow).tolist()
        decoded: dict[int, object] = {}
        for i in special:
            data = chunk[i][1]
            if data[0] == _RELATION:
                rel = pgoutput.parse_relation(data)
                self.keys[rel.relation_id] = tuple(
                    j for j, c in enumerate(rel.columns) if c.is_key)
                decoded[i] = rel
            elif data[0] == _TRUNCATE:
                trunc = pgoutput.parse_truncate(data)
                decoded[i] = trunc
                weights[i] = len(trunc.relation_ids)
            else:
                upd = pgoutput.parse_update(data)
                decoded[i] = upd
                key = self.keys.get(upd.relation_id, ())
                changed = upd.old is not None and key_changed(key, upd.old, upd.new)
                weights[i] = 2 if changed else 1

        # seq of each message's last row: rows so far in its transaction.
        done = np.cumsum(weights)
        txn_base = np.concatenate(([-self.seq], done[begins]))
        seq_end = done - txn_base[txn_of]

        # Deliver in order: the rows between two Relation messages, then the Relation.
        parsed = _Chunk(buf, starts, lengths, kinds, lsns, fast, weights, seq_end, txn_of,
                        txn_commit, txn_ts, txn_xid, decoded,
                        [i for i in special if not isinstance(decoded[i], Relation)])
        start = 0
        for cut in [*(i for i in special if isinstance(decoded[i], Relation)), n]:
            self._deliver(parsed, start, cut)
            if cut < n:
                relation = decoded[cut]
                assert isinstance(relation, Relation)
                self.sink.relation(relation, int(txn_commit[txn_of[cut]]))
            start = cut + 1

        # Carry the open transaction into the next chunk.
        last = int(txn_of[-1])
        self.txn = Commit(int(txn_commit[last]), int(txn_ts[last]), int(txn_xid[last]))
        marks = np.flatnonzero(is_begin | (kinds == _COMMIT))
        if len(marks):
            self.active = bool(kinds[marks[-1]] == _BEGIN and txn_active[last])
        self.seq = int(seq_end[-1])
        self.rows += int(weights.sum())

    def _deliver(self, chunk: _Chunk, lo: int, hi: int) -> None:
        """Hand the rows of messages ``lo`` to ``hi`` (exclusive) of the chunk to the sink:
        one block per table for the fast rows, then the slow rows one by one."""
        sink = self.sink
        picked = np.flatnonzero(chunk.fast[lo:hi]) + lo
        if len(picked):
            txns = chunk.txn_of[picked]
            block = RowBlock(chunk.buf, chunk.starts[picked], chunk.lengths[picked],
                             chunk.kinds[picked], chunk.lsns[picked], chunk.seq_end[picked],
                             chunk.txn_commit[txns], chunk.txn_ts[txns], chunk.txn_xid[txns])
            relation_ids = _be(chunk.buf, block.starts + 1, 4)
            for relation_id in np.unique(relation_ids).tolist():
                mine = relation_ids == relation_id
                sink.rows(int(relation_id), block if bool(mine.all()) else block.select(mine))
        for i in chunk.slow[bisect.bisect_left(chunk.slow, lo):bisect.bisect_left(chunk.slow, hi)]:
            message = chunk.decoded[i]
            lsn = int(chunk.lsns[i])
            seq = int(chunk.seq_end[i])
            t = chunk.txn_of[i]
            txn = Commit(int(chunk.txn_commit[t]), int(chunk.txn_ts[t]), int(chunk.txn_xid[t]))
            if isinstance(message, pgoutput.Truncate):
                ids = message.relation_ids
                for k, relation_id in enumerate(ids):
                    sink.add(relation_id, "t", None, lsn, seq - len(ids) + 1 + k, txn, False,
                             None)
            elif chunk.weights[i] == 2:  # an update that changed the key: two rows
                assert isinstance(message, pgoutput.Update) and message.old is not None
                sink.add(message.relation_id, "d", message.old, lsn, seq - 1, txn, False, None)
                sink.add(message.relation_id, "c", _filled(message), lsn, seq, txn, True, None)
            else:
                assert isinstance(message, pgoutput.Update)
                sink.add(message.relation_id, "u", _filled(message), lsn, seq, txn, True,
                         message.old)


class _Chunk(NamedTuple):
    """One chunk's messages as arrays (see :meth:`TransactionWalker.feed`)."""

    buf: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    kinds: np.ndarray
    lsns: np.ndarray
    fast: np.ndarray  # rows that reach the sink in blocks
    weights: np.ndarray  # rows each message becomes
    seq_end: np.ndarray  # seq of each message's last row
    txn_of: np.ndarray  # transaction number of each message (0: open at the start)
    txn_commit: np.ndarray  # per transaction number
    txn_ts: np.ndarray
    txn_xid: np.ndarray
    decoded: dict[int, object]  # the rare messages, decoded, by position
    slow: list[int]  # positions of the rare row messages (not Relation), ascending


def _filled(update: pgoutput.Update) -> WireTuple:
    """The update's new row, with the values it did not send (unchanged TOAST) taken
    from its old row when the source sent the whole of it (``REPLICA IDENTITY FULL``:
    ``old_kind`` ``"O"``), as the change builder does: a wide key left as it was keeps
    its value."""
    if update.old_kind != "O" or update.old is None or \
            not any(n is UNAVAILABLE for n in update.new):
        return update.new
    return tuple(o if n is UNAVAILABLE else n
                 for o, n in zip(update.old, update.new, strict=True))
