"""A ``tidemark-repair``'s rows from MariaDB (:mod:`tidemark.source.repair`): the listed
keys' rows as they were at the end of the batch that takes it, selected and normalised
as a snapshot's are (:func:`~tidemark.source.mariadb.snapshot.select_expression`,
:func:`~tidemark.source.mariadb.snapshot.normalizer`: the binlog decoder's text), with a
key filter.

**At the batch's end, exactly.** MariaDB cannot open a read view at a chosen binlog
position: :func:`~tidemark.source.mariadb.read_view.read_view_from` opens one at a
position ``P`` at or after the batch's end ``E`` (never before: a transaction already
in the binlog may not be visible yet, and a row read then would overwrite it with an
older state at a higher sequence). Changes committed in ``(E, P]`` are then taken back
out of the rows: the binlog from ``E`` to ``P`` is decoded (full row images, which
tidemark requires) and a key's first change there gives its row at ``E`` (an update's
or delete's before image; none after an insert). Those changes reach the target in the
next batches, above the repair's rows, as any change does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import re
from collections.abc import Iterator, Sequence
from typing import Any

from tidemark.event import ChangeEvent, Op, TableId, WireTuple
from tidemark.logical_type import Kind, LogicalType
from tidemark.source.mariadb import client
from tidemark.source.mariadb import snapshot as snap
from tidemark.source.mariadb.change_builder import ChangeBuilder
from tidemark.source.mariadb.position import BinlogPosition
from tidemark.source.mariadb.read_view import read_view_from
from tidemark.source.mariadb.types import logical_type
from tidemark.source.read_plan import ChangeSink, ReadOptions
from tidemark.source.repair import RepairRead, RepairRequest, emit_repair, key_text

log = logging.getLogger(__name__)

Key = tuple[str | None, ...]

_MOMENT = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(\d*?)0*)?(\+00)?")


def _same_text(value: Any) -> str | None:
    """A key value's text in one form for matching: a signal's key (PostgreSQL's forms:
    fractions without trailing zeros, ``\\x<hex>`` for bytes) and the decoder's text of
    the same value (``.500000``, raw bytes) match."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return "\\x" + bytes(value).hex()
    text = str(value)
    moment = _MOMENT.fullmatch(text)
    if moment is None:
        return text
    whole, fraction, zone = moment.groups()
    return whole + (f".{fraction}" if fraction else "") + (zone or "")


def _param(value: Any, column: Any) -> Any:
    """A signal's key value as a query parameter of *column*: bytes for a binary column
    (the signal names them ``\\x<hex>``), a timestamp without its ``+00`` (which
    MariaDB does not read as a zone), the text otherwise."""
    text = key_text(value)
    if logical_type(column).kind is Kind.BYTES:
        if not text.startswith("\\x"):
            raise ValueError(f"a key of the binary column {column.name} must be given as "
                             f"\\x<hex digits>, got {text!r}")
        return bytes.fromhex(text[2:])
    moment = _MOMENT.fullmatch(text)
    if moment is not None and moment.group(3):
        return text[:-3]  # UTC wall-clock text: the session's time zone is +00:00
    return text


class BinlogRepairRead(RepairRead):
    """A repair partition read at the binlog position *end* (an offset's fields)."""

    def __init__(self, index: int, requests: Sequence[RepairRequest],
                 end: dict[str, Any]) -> None:
        super().__init__(index, requests, BinlogPosition.from_offset(end).key)
        self.end = end


def read_repair(options: ReadOptions, part: BinlogRepairRead,
                sink: ChangeSink) -> Iterator[None]:
    """The change rows of the partition's repairs, into *sink*."""
    end = BinlogPosition.from_offset(part.end)
    conn = client.connect(client.parse_url(options.dsn), conv=client.RAW_VALUES)
    with contextlib.closing(conn):
        view = read_view_from(conn, end)
        read = []
        layouts: dict[str, Layout] = {}
        for request in part.requests:
            table = TableId.parse(request.table)
            columns = snap.describe(conn, table)
            layouts[request.table] = tuple((c.name, logical_type(c)) for c in columns)
            read.append((request, [c.name for c in columns], _rows(conn, request, columns)))
        conn.commit()
    if view.key > end.key:
        log.debug("repair %s read at %s: taking back the changes after %s",
                  ", ".join(r.id for r in part.requests), view, end)
        read = _as_at(options, read, end, view, layouts)
    for request, names, rows in read:
        emit_repair(sink, _as_read(request, names, rows), names, rows, part.commit_lsn)
        yield


def _as_read(request: RepairRequest, names: Sequence[str],
             rows: Sequence[WireTuple]) -> RepairRequest:
    """*request* with each key found among *rows* named as the row names it, so
    :func:`~tidemark.source.repair.emit_repair` finds it (no ``d`` for it)."""
    index = [list(names).index(k) for k in request.key_columns]
    found: dict[Key, tuple[Any, ...]] = {}
    for row in rows:
        key = tuple(row[i] for i in index)
        found[tuple(_same_text(v) for v in key)] = tuple(
            v if isinstance(v, str) else _same_text(v) for v in key)
    keys = tuple(found.get(tuple(_same_text(key_text(v)) for v in k), k) for k in request.keys)
    return dataclasses.replace(request, keys=keys)


def _rows(conn: Any, request: RepairRequest, columns: Sequence[Any]) -> list[WireTuple]:
    table = TableId.parse(request.table)
    normalize = [snap.normalizer(c) for c in columns]
    key = ", ".join(snap.quote(k) for k in request.key_columns)
    one = "(" + ", ".join(["%s"] * len(request.key_columns)) + ")"
    query = (f"SELECT {', '.join(snap.select_expression(c) for c in columns)} "
             f"FROM {snap.quote(table.schema)}.{snap.quote(table.table)} "
             f"WHERE ({key}) IN ({', '.join([one] * len(request.keys))})")
    by_name = {c.name: c for c in columns}
    params: list[Any] = [_param(v, by_name[name]) for k in request.keys
                         for name, v in zip(request.key_columns, k, strict=True)]
    with conn.cursor() as cur:
        cur.execute(query, params)
        return [tuple(None if v is None else f(v) for f, v in zip(normalize, row, strict=True))
                for row in cur.fetchall()]


Read = list[tuple[RepairRequest, list[str], list[WireTuple]]]
#: A table's columns as (name, logical type), in order.
Layout = tuple[tuple[str, LogicalType], ...]


def _as_at(options: ReadOptions, read: Read, end: BinlogPosition,
           view: BinlogPosition, layouts: dict[str, Layout]) -> Read:
    """*read* (rows at *view*, whose tables' columns *layouts* gives) as the rows were
    at *end*: each key's first change in ``(end, view]`` replaced by what it found."""
    wanted = {TableId.parse(r.table) for r, _, _ in read}
    # Per table: key -> the row at *end* (None: absent), for keys changed after it.
    before: dict[str, dict[Key, WireTuple | None]] = {str(t): {} for t in wanted}
    # Keys whose row at *end* is in another layout than the view's (DDL in between).
    other_layout: dict[str, set[Key]] = {str(t): set() for t in wanted}
    truncated: set[str] = set()
    for event in _changes(options, wanted, end, view):
        table = str(event.table)
        assert event.schema is not None
        if event.op is Op.TRUNCATE:
            truncated.add(table)
            continue
        at = list(event.schema.key_indexes)
        first = before[table]
        if event.raw_before is not None:
            key = tuple(_same_text(event.raw_before[i]) for i in at)
            if key not in first and tuple((c.name, c.logical) for c in
                                          event.schema.columns) != layouts[table]:
                other_layout[table].add(key)
            first.setdefault(key, event.raw_before)
        if event.raw_after is not None:
            first.setdefault(tuple(_same_text(event.raw_after[i]) for i in at), None)
    out: Read = []
    for request, names, rows in read:
        if request.table in truncated:
            log.warning("repair %s of %s: the table was truncated after the batch's end; "
                        "its rows are those read at %s (the stream applies the truncate "
                        "after them)", request.id, request.table, view)
            out.append((request, names, rows))
            continue
        changed = before[request.table]
        index = [names.index(k) for k in request.key_columns]
        kept = [row for row in rows
                if tuple(_same_text(row[i]) for i in index) not in changed]
        # A row at *end* in another layout (DDL in between: columns added, dropped,
        # renamed or retyped) cannot be restored in this one; missing from the rows it
        # would become a delete: the key is left out.
        different = other_layout[request.table]
        restored = [row for key, row in changed.items() if row is not None
                    and key not in different and _requested(request, key, rows, index)]
        other = {key for key, row in changed.items() if row is not None
                 and key in different and _requested(request, key, rows, index)}
        if other:
            log.warning("repair %s of %s: %d key(s) changed after the batch's end in "
                        "another column layout (a schema change between %s and %s) are "
                        "left out of the repair; repair them again", request.id,
                        request.table, len(other), end, view)
        out.append((_without(request, other) if other else request, names,
                    kept + restored))
    return out


def _without(request: RepairRequest, keys: set[Key]) -> RepairRequest:
    """*request* less *keys* (in :func:`_same_text` form)."""
    return dataclasses.replace(request, keys=tuple(
        k for k in request.keys if tuple(_same_text(key_text(v)) for v in k) not in keys))


def _requested(request: RepairRequest, key: Key, rows: Sequence[WireTuple],
               index: Sequence[int]) -> bool:
    """Whether *key* is one of *request*'s: by the keys' texts, or one read at the view."""
    same = tuple(_same_text(v) for v in key)
    return same in {tuple(_same_text(key_text(v)) for v in k) for k in request.keys} or \
        same in {tuple(_same_text(row[i]) for i in index) for row in rows}


def _changes(options: ReadOptions, tables: set[TableId], start: BinlogPosition,
             stop: BinlogPosition) -> Iterator[ChangeEvent]:
    """The changes of *tables* committed in ``(start, stop]``."""
    settings = client.parse_url(options.dsn)
    builder = ChangeBuilder(name="tidemark", position=start, captured=tables.__contains__,
                            max_rows_in_memory=options.arrow_batch_rows,
                            max_bytes_in_memory=options.arrow_batch_bytes)
    stream = client.BinlogStream(settings, start, server_id=random.randrange(1 << 20, 1 << 31),
                                 blocking=False)
    with stream, contextlib.closing(builder):
        builder.checksum = stream.checksum
        for event in stream.events():
            records = builder.handle(event)
            if records is not None:
                for chunk in builder.with_rest(records, options.arrow_batch_rows,
                                               options.arrow_batch_bytes):
                    yield from (r for r in chunk if isinstance(r, ChangeEvent))
            if not builder.in_transaction and builder.position_key >= stop.key:
                return
