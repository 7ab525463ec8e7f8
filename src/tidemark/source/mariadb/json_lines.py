"""MariaDB rows events to Debezium JSON lines: the fused path of ``tidemark capture``.

The rows of one rows event share their table, operation, transaction and position;
only their index (``source.row``) differs. So a whole rows event's lines are written in
one call, from its decoded row tuples, with no change event object per row: by the C
writer (``EventRenderer.lines`` of ``tidemark.serde._render``) where it is built, else
by :class:`PythonRowLines`, its Python twin. Both write what
:class:`~tidemark.source.mariadb.change_builder.ChangeBuilder`'s change events through
:class:`~tidemark.serde.debezium_json.DebeziumJsonSerializer` become, byte for byte
(the tests hold them to it); without transaction metadata only, whose blocks differ
per event.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple, Protocol

from tidemark.event import Record, SnapshotMarker, SourceContext, TableId, TableSchema, WireTuple
from tidemark.key_change import key_changed
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.serde.json_codegen import compile_row_converter, compiled_columns
from tidemark.serde.json_columns import KIND_FLOAT, KIND_RAW, KIND_STRING
from tidemark.serde.json_values import KIND_DATE, KIND_DECIMAL, KIND_ZONED
from tidemark.serde.source_json import SourceJson
from tidemark.source.mariadb.binlog import RowsEvent
from tidemark.source.mariadb.row_decoder import RowDecoder

try:
    from tidemark.source.mariadb import _row_image
except ImportError:  # not built: rows are decoded, and written by the serializer's code
    _row_image = None  # type: ignore[assignment]

#: ``(before, after)`` per row of a rows event, as the row decoder gives them.
RowPairs = list[tuple[WireTuple | None, WireTuple | None]]
#: ``lines(rows, op, head, tail, ts_text, tombstones)``: one text per change event.
RowLinesWriter = Callable[[RowPairs, str, str, str, str, bool], list[str]]

_STREAMED: Final = SnapshotMarker.FALSE
_ROW_ZERO: Final = ',"row":0'
_KEPT: Final = 1024  # writers and plans kept, as the change builder keeps table maps


class EventRows(NamedTuple):
    """One rows event of a captured table, held until the commit: its decoded rows, or
    the event itself for the compiled decoder to write (*json*: its :func:`fused_plan`)."""

    schema: TableSchema
    op: str  # "c", "u" or "d"
    rows: RowPairs | None
    file: str
    pos: int
    event: RowsEvent | None = None
    decoder: RowDecoder | None = None
    json: tuple[Any, ...] | None = None


#: The compiled decoder's JSON kind of each (decoder kind, writer kind) pair it writes in
#: one step (``_row_image.c``, rows_lines): the writer's text of the decoder's value.
_FUSED: Final[dict[tuple[int, int], int]] = {} if _row_image is None else {
    (_row_image.INT, KIND_RAW): _row_image.J_INT,
    (_row_image.UTF8, KIND_STRING): _row_image.J_STRING,
    (_row_image.DATE, KIND_DATE): _row_image.J_DATE,
    (_row_image.TIMESTAMP2, KIND_ZONED): _row_image.J_ZONED,
    (_row_image.DECIMAL, KIND_DECIMAL): _row_image.J_DECIMAL,
    (_row_image.DOUBLE, KIND_FLOAT): _row_image.J_DOUBLE,
}


def fused_plan(decoder: RowDecoder, schema: TableSchema, options: DebeziumJsonOptions
               ) -> tuple[Any, ...] | None:
    """What ``_row_image.rows_lines`` needs to write *schema*'s lines from its images:
    (kinds, params, names, nulls, key indexes, key names); None unless every column is
    of a pair it writes (and every key column an integer or a text)."""
    plan = decoder.plan
    if plan is None or _row_image is None or len(plan) != len(schema.columns):
        return None
    columns = compiled_columns(schema, options)
    kinds = []
    for (decoded, *_), written in zip(plan, columns.kinds, strict=True):
        kind = _FUSED.get((decoded, written))
        if kind is None:
            return None
        kinds.append(kind)
    keys = tuple(schema.key_indexes)
    if any(kinds[i] not in (_row_image.J_INT, _row_image.J_STRING) for i in keys):
        return None  # the key's change is seen in its bytes: exact for these alone
    return (bytes(kinds), columns.params, columns.names, columns.nulls, keys,
            columns.key_names)


class TransactionSource(Protocol):
    """What the lines need of a committed transaction: its events' source context, and
    the change events of rows that do not go through the fused path."""

    def context(self, table: TableId, file: str, pos: int, row: int) -> SourceContext: ...

    def records(self, rows: Sequence[Any]) -> Sequence[Record | str]: ...


class PythonRowLines:
    """The Python twin of the C ``EventRenderer.lines`` for one table schema: the
    generated row and key converters, and the line around them."""

    def __init__(self, schema: TableSchema, options: DebeziumJsonOptions) -> None:
        self._row = compile_row_converter(schema.columns, options)
        self._keys = tuple(schema.key_indexes)
        self._key = compile_row_converter(schema.columns, options, self._keys) \
            if self._keys else None

    def lines(self, rows: RowPairs, op: str, head: str, tail: str, ts_text: str,
              tombstones: bool) -> list[str]:
        """One text per change event of *rows* (see ``EventRenderer.lines``)."""
        out: list[str] = []
        keys = self._keys
        for index, (before, after) in enumerate(rows):
            source = f"{head}{index}{tail}"
            if op == "u" and keys and before is not None and after is not None \
                    and key_changed(keys, before, after):
                out.append(self._line("d", before, None, source, ts_text, tombstones))
                out.append(self._line("c", None, after, source, ts_text, tombstones))
            else:
                out.append(self._line(op, None if op == "c" else before,
                                      None if op == "d" else after, source, ts_text,
                                      tombstones))
        return out

    def _line(self, op: str, before: WireTuple | None, after: WireTuple | None,
              source: str, ts_text: str, tombstones: bool) -> str:
        key_row = before if op == "d" else after
        key = "null" if self._key is None or key_row is None else self._key(key_row)
        before_text = "null" if before is None else self._row(before)
        after_text = "null" if after is None else self._row(after)
        line = (f'{{"key":{key},"value":{{"before":{before_text},"after":{after_text},'
                f'"source":{source},"transaction":null,"op":"{op}",{ts_text}}}\n')
        if tombstones and op == "d" and key != "null":
            line += f'{{"key":{key},"value":null}}\n'
        return line


class LineWriter:
    """Writes committed transactions' rows as Debezium JSON lines in *serializer*'s
    options (without transaction metadata). One per change builder (not thread-safe).

    *compiled*: the C writer where it is built (the default), else the Python twin.
    """

    def __init__(self, serializer: DebeziumJsonSerializer, *, compiled: bool = True) -> None:
        options = serializer.options
        if options.transaction_metadata:
            raise ValueError("MariaDB's JSON lines are written without transaction "
                             "metadata; use the change events for it")
        self.serializer = serializer
        self._compiled = compiled and serializer.compiled
        self._tombstones = options.tombstones_on_delete
        self._writers: dict[int, tuple[TableSchema, RowLinesWriter]] = {}
        self._fused: dict[int, tuple[RowDecoder, tuple[Any, ...] | None]] = {}
        self._blocks = SourceJson()
        #: Whether a transaction since this was last reset gave change events too (a
        #: truncate, a signal table's rows): their reader writes or takes them.
        self.mixed = False

    def hold(self, append: Callable[[EventRows], None], schema: TableSchema,
             decoder: RowDecoder, event: RowsEvent, file: str, pos: int) -> int:
        """Keep *event* until its transaction's commit, through *append*: as it is, for
        the compiled decoder to write its lines then, or decoded; its rows' count."""
        entry = self._fused.get(id(decoder))
        if entry is None or entry[0] is not decoder:
            json = fused_plan(decoder, schema, self.serializer.options) \
                if self._compiled else None
            if len(self._fused) >= _KEPT:  # table maps come anew after DDL: no growth
                self._fused.clear()
            entry = self._fused[id(decoder)] = (decoder, json)
        json = entry[1]
        if json is not None:
            count = decoder.count_rows(event)
            if count >= 0:
                append(EventRows(schema, event.op, None, file, pos, event, decoder, json))
                return count
        rows = decoder.rows(event)
        append(EventRows(schema, event.op, rows, file, pos))
        return len(rows)

    def writer(self, schema: TableSchema) -> RowLinesWriter:
        """The lines writer of *schema*'s rows events, made on first use."""
        entry = self._writers.get(id(schema))
        if entry is None or entry[0] is not schema:
            lines: RowLinesWriter | None = None
            if self._compiled:
                lines = getattr(self.serializer.renderer(schema), "lines", None)
            if lines is None:
                lines = PythonRowLines(schema, self.serializer.options).lines
            if len(self._writers) >= _KEPT:
                self._writers.clear()
            entry = self._writers[id(schema)] = (schema, lines)
        return entry[1]

    def source_parts(self, made: TransactionSource, table: TableId, file: str,
                     pos: int) -> tuple[str, str]:
        """The ``source`` block of a rows event's rows around their row index: the
        serializer's own block of row 0, cut at its ``"row":0``. (Unambiguous: inside a
        JSON string a quote is escaped, so ``,"row":`` is only ever the member.)"""
        block = self._block(made, table, file, pos, 0)
        cut = block.find(_ROW_ZERO) + len(_ROW_ZERO) - 1
        if cut < len(_ROW_ZERO):
            raise AssertionError(f"the source block has no row member: {block}")
        return block[:cut], block[cut + 1:]

    def _block(self, made: TransactionSource, table: TableId, file: str, pos: int,
               row: int) -> str:
        return self._blocks.text(made.context(table, file, pos, row), _STREAMED, table, None)

    def lines(self, entries: Sequence[EventRows | Any], made: TransactionSource
              ) -> list[Record | str]:
        """The texts of a transaction's *entries* in order: a rows event's as lines,
        anything else (a truncate, a signal table's row) as *made*'s change events."""
        out: list[Record | str] = []
        pending: list[Any] = []
        ts_text = self.serializer.ts_fields(time.time_ns() // 1000)
        tombstones = self._tombstones
        for entry in entries:
            if entry.__class__ is not EventRows:
                pending.append(entry)
                continue
            if pending:
                out += made.records(pending)
                pending = []
                self.mixed = True
            schema = entry.schema
            head, tail = self.source_parts(made, schema.table, entry.file, entry.pos)
            rows = entry.rows
            if rows is None:  # the compiled decoder's, unless it leaves them to decoding
                assert entry.decoder is not None and entry.event is not None
                assert entry.json is not None
                lines = entry.decoder.json_lines(entry.event, entry.json, head, tail,
                                                 ts_text, tombstones)
                if lines is not None:
                    out += lines
                    continue
                rows = entry.decoder.rows(entry.event)
            out += self.writer(schema)(rows, entry.op, head, tail, ts_text, tombstones)
        if pending:
            out += made.records(pending)
            self.mixed = True
        return out
