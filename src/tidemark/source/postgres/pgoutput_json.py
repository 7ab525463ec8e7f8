"""pgoutput row messages straight to Debezium JSON lines: the fused fast path of
``tidemark capture``.

The general path decodes a message into a tuple of wire values, wraps it in a
:class:`~tidemark.event.ChangeEvent` and serializes that with
:class:`~tidemark.serde.debezium_json.DebeziumJsonSerializer`. Per change that is
several Python objects and a type check per column. Here, code generated once per
table schema (when its Relation message arrives) goes from the bytes of an Insert, an
Update without an old tuple, or a Delete directly to the finished JSON line — key,
value and, for deletes, the tombstone — using the serializer's own per-type column
converters, so the output is byte for byte the same.

Anything the generated code does not expect (another column count, a binary value,
truncated bytes, a converter that fails) raises; the caller then takes the general
path, which emits the same text or raises the precise error.

For lines, the same writer compiled (``_pgoutput_line``, where it is built) takes the
place of the generated code: one writer per operation, from the same per-column
decisions (:func:`~tidemark.serde.json_columns.column_fragment`), reading the message's
bytes; the generated code is what it is tested against.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from tidemark.event import TableSchema
from tidemark.logical_type import Kind
from tidemark.serde.debezium_json import (
    TEMPLATE_NAMES,
    DebeziumJsonOptions,
    column_fragment,
    json_fragment,
)
from tidemark.serde.json_columns import _column_writer, _compiled_kind

try:
    from tidemark.source.postgres._pgoutput_line import LineWriter as _LineWriter
except ImportError:  # not built: the generated Python code writes the same lines
    _LineWriter = None  # type: ignore[assignment,misc]

#: Whether the compiled line writer (``tidemark.source.postgres._pgoutput_line``) is built.
COMPILED_LINES: Final = _LineWriter is not None

#: ``line(data, text, lsn, parts)``: *text* is ``data.decode("ascii")`` for the ASCII
#: variant (ignored by the UTF-8 one); *parts* is what
#: :meth:`DebeziumJsonSerializer.stream_line_parts` returns for the event.
LineFunction = Callable[[bytes, str, int, tuple[str, str, str]], str]

#: ``emit(lsn, message, key text or None, value text)`` -> what the
#: :data:`EventFunction` returns.
Emit = Callable[[int, bytes, str | None, str], Any]

#: ``event(data, text, lsn, (head, middle, tail, emit))``: like a
#: :data:`LineFunction`, with the parts of :meth:`DebeziumJsonSerializer.stream_value_parts`
#: and an *emit* that gets the message, its key text and its value text.
EventFunction = Callable[[bytes, str, int, tuple[str, str, str, Emit]], Any]

#: The *parts* of a :data:`RecordFunction`: the value parts as for an
#: :data:`EventFunction`, then ``make_record, destination, make_event, orders, cell``.
RecordParts = tuple[str, str, str, Callable[..., Any], str, Any, Any, list[int]]

#: ``record(data, text, lsn, parts)``: like an :data:`EventFunction`, but makes the
#: result itself, without a call to Python: ``make_record(destination, key text,
#: value text, None, make_event, lsn, total order, table order, data)``, having counted
#: the change in ``orders.total`` and ``cell[0]`` (the engine's converted records; see
#: :class:`~tidemark.serde.converted.RenderedRecord`).
RecordFunction = Callable[[bytes, str, int, RecordParts], Any]

_u32: Final = struct.Struct(">I").unpack_from

# Byte offsets in Insert/Update/Delete messages outside a streamed block (protocol v1):
# type (1), relation id (4), tuple kind (1), column count (2), then the columns.
_COLUMNS_AT: Final = 8


# Types whose text is short and whose JSON conversion is a Python function call (numeric
# base64, timestamps, dates …), so that memoizing it pays and stays small.
_MEMO_TYPES: Final = frozenset({
    Kind.DECIMAL, Kind.MONEY, Kind.DATE, Kind.TIME, Kind.TIMETZ, Kind.TIMESTAMP,
    Kind.TIMESTAMPTZ, Kind.INTERVAL,
})
_MEMO_SIZE: Final = 1024  # entries per column; cleared when full


class FusedFallbackError(Exception):
    """Raised by generated code for input it does not handle; use the general path."""


class FusedCodec:
    """The generated functions of one table schema.

    ``insert``, ``update`` and ``delete`` are ``(ascii, utf8)`` pairs of generated
    functions; the ASCII variant slices values out of the message decoded as ASCII (one
    character per byte), the other decodes each value as UTF-8. ``update`` handles only
    updates without an old tuple (the key did not change and the replica identity is
    not FULL).

    Three shapes: :data:`LineFunction` (the default) returns the finished line;
    with *events* the functions are :data:`EventFunction` s, which hand the message,
    its key text and its value text to the ``emit`` of their *parts*; with *records*
    ``insert`` and ``update`` are :data:`RecordFunction` s (and ``delete`` an
    EventFunction, whose *emit* makes a delete's two records).

    Lines are written by the compiled writer where it is built (and *compiled*): then
    both functions of a pair are the same :data:`LineFunction`, which ignores *text*
    (see :attr:`compiled`).
    """

    __slots__ = ("compiled", "delete", "insert", "schema", "update")

    def __init__(self, schema: TableSchema, options: DebeziumJsonOptions, *,
                 events: bool = False, records: bool = False, compiled: bool = True) -> None:
        self.schema = schema
        # One memo per column, shared by all six functions: an update hits the values
        # its row's insert converted.
        memos: list[dict[str, str]] = [{} for _ in schema.columns]
        shape = "records" if records else "events" if events else "lines"
        #: Whether the functions are the compiled writer's (one per operation).
        self.compiled = (compiled and shape == "lines" and _LineWriter is not None
                         and bool(schema.columns))
        if self.compiled:
            self.insert, self.update, self.delete = _compiled_writers(schema, options)
            return
        self.insert = _compile(schema, options, "c", memos, shape)
        self.update = _compile(schema, options, "u", memos, shape)
        self.delete = _compile(schema, options, "d", memos,
                               "events" if records else shape)


def _compiled_writers(schema: TableSchema, options: DebeziumJsonOptions
                      ) -> tuple[tuple[Any, Any], tuple[Any, Any], tuple[Any, Any]]:
    """The compiled writer's (insert, update, delete) pairs, from the per-column
    decisions the generated code is made of."""
    assert _LineWriter is not None
    columns = schema.columns
    writers = [_column_writer(column, options) for column in columns]
    compiled = [_compiled_kind(kind, function) for kind, _, function, *_ in writers]
    keys = schema.key_indexes
    # Memoized as the generated code memoizes (the converted texts of these types
    # recur); shared by the three writers, keyed by the value's bytes.
    memos: tuple[dict[bytes, str] | None, ...] = tuple(
        {} if column.logical.kind in _MEMO_TYPES else None for column in columns)
    common: dict[str, Any] = {
        "kinds": bytes(kind for kind, _ in compiled),
        "params": bytes(param for _, param in compiled),
        "functions": tuple(function for _, _, function, _, _ in writers),
        "names": tuple(_member(n, column.name) for n, column in enumerate(columns)),
        "nulls": tuple(null_text.encode() for *_, null_text, _ in writers),
        "placeholders": tuple(json_fragment(placeholder).encode()
                              for *_, placeholder in writers),
        "memos": memos,
        "key_indexes": tuple(keys),
        "key_names": tuple(_member(n, columns[i].name) for n, i in enumerate(keys)),
        "tombstone": options.tombstones_on_delete,
    }
    insert = _LineWriter(**common, delete=False)
    delete = _LineWriter(**common, delete=True)
    # An update without an old tuple is an insert's line but for its op, which the
    # parts (the source block's tail) carry.
    return (insert, insert), (insert, insert), (delete, delete)


def _member(position: int, name: str) -> bytes:
    """The UTF-8 JSON text before an object's member value: ``{"name":`` or ``,"name":``."""
    return (("{" if position == 0 else ",") + json_fragment(name) + ":").encode()


def _compile(schema: TableSchema, options: DebeziumJsonOptions, op: str,
             memos: list[dict[str, str]], shape: str) -> tuple[Any, Any]:
    return (_compile_variant(schema, options, op, memos, ascii_only=True, shape=shape),
            _compile_variant(schema, options, op, memos, ascii_only=False, shape=shape))


class _Pieces:
    """A text as a sequence of literal texts and variable names, written as one
    f-string whose literals live in the generated function's namespace."""

    def __init__(self, namespace: dict[str, Any], prefix: str) -> None:
        self.namespace = namespace
        self.prefix = prefix  # of this text's literal names, unique in the namespace
        self.items: list[tuple[bool, str]] = []  # (is literal, text or variable name)

    def literal(self, text: str) -> None:
        self.items.append((True, text))

    def variable(self, name: str) -> None:
        self.items.append((False, name))

    def fstring(self) -> str:
        """The items as an f-string expression; neighbouring literals merged into one
        namespace variable (``L0``, ``L1`` … with ``L`` the text's prefix)."""
        fields: list[str] = []
        merged = False  # the last field is a literal
        for is_literal, text in self.items:
            if is_literal and merged:
                self.namespace[fields[-1]] += text
            elif is_literal:
                name = f"{self.prefix}{len(fields)}"
                self.namespace[name] = text
                fields.append(name)
            else:
                fields.append(text)
            merged = is_literal
        return "f'" + "".join("{" + f + "}" for f in fields) + "'"


def _compile_variant(schema: TableSchema, options: DebeziumJsonOptions, op: str,
                     memos: list[dict[str, str]], *, ascii_only: bool, shape: str) -> Any:
    """Generate straight-line code for one (schema, op, text variant, shape).

    Column and table names are data, never code: every piece of literal JSON text lives
    in a variable of the generated function's namespace (``L0``, ``K0``, ``V0`` …) and the
    generated source contains only identifiers and numbers.
    """
    columns = schema.columns
    ncols = len(columns)
    namespace: dict[str, Any] = {
        **TEMPLATE_NAMES,
        "_u32": _u32, "_Fallback": FusedFallbackError, "_ncols": ncols.to_bytes(2, "big"),
    }
    lines = [
        "def fused(data, text, lsn, parts):",
        f"    if data[6:{_COLUMNS_AT}] != _ncols: raise _Fallback",
        f"    pos = {_COLUMNS_AT}",
    ]
    value = "text[pos + 5:e]" if ascii_only else "data[pos + 5:e].decode()"
    for i, column in enumerate(columns):
        template, function, null_text, placeholder = column_fragment(column, options)
        namespace[f"n{i}"] = null_text
        namespace[f"p{i}"] = json_fragment(placeholder)
        if template is not None:
            convert = [f"        f{i} = {template.format(v=f'v{i}')}"]
        elif column.logical.kind in _MEMO_TYPES:
            # Values of these types repeat (an update re-sends the unchanged columns of
            # a row, often one just inserted; amounts, dates and times recur): a small
            # memo per column turns most conversions into one dict lookup.
            namespace[f"c{i}"] = function
            namespace[f"M{i}"] = memos[i]
            convert = [
                f"        f{i} = M{i}.get(v{i})",
                f"        if f{i} is None:",
                f"            f{i} = c{i}(v{i})",
                f"            if len(M{i}) >= {_MEMO_SIZE}: M{i}.clear()",
                f"            M{i}[v{i}] = f{i}",
            ]
        else:
            namespace[f"c{i}"] = function
            convert = [f"        f{i} = c{i}(v{i})"]
        lines += [
            "    k = data[pos]",
            "    if k == 116:",  # 't': text value
            "        e = pos + 5 + _u32(data, pos + 1)[0]",
            f"        v{i} = {value}",
            "        pos = e",
            *convert,
            "    elif k == 110:",  # 'n': SQL NULL
            f"        f{i} = n{i}",
            "        pos += 1",
            "    elif k == 117:",  # 'u': unchanged TOASTed value, not sent
            f"        f{i} = p{i}",
            "        pos += 1",
            "    else:",  # binary values, garbage
            "        raise _Fallback",
        ]
    lines += [
        "    if pos != len(data): raise _Fallback",
        "    head, middle, tail" + {"lines": "", "events": ", emit",
                                   "records": ", make_record, destination, make_event, "
                                              "orders, cell"}[shape] + " = parts",
        "    ls = str(lsn)",  # once, not twice by the f-string
    ]

    def row(text: _Pieces) -> None:
        if not columns:
            text.literal("{}")
            return
        for i, column in enumerate(columns):
            text.literal(("{" if i == 0 else ",") + json_fragment(column.name) + ":")
            text.variable(f"f{i}")
        text.literal("}")

    def key(text: _Pieces) -> None:
        if not schema.key_indexes:
            text.literal("null")
            return
        for n, i in enumerate(schema.key_indexes):
            text.literal(("{" if n == 0 else ",") + json_fragment(columns[i].name) + ":")
            text.variable(f"f{i}")
        text.literal("}")

    def envelope(text: _Pieces) -> None:
        """The value up to its end (*tail* closes it, for lines the line too)."""
        text.literal('{"before":')
        if op == "d":
            row(text)
            text.literal(',"after":null')
        else:
            text.literal('null,"after":')
            row(text)
        text.literal(',"source":')
        for name in ("head", "ls", "middle", "ls", "tail"):
            text.variable(name)

    if shape != "lines":
        key_text, value_text = _Pieces(namespace, "K"), _Pieces(namespace, "V")
        key(key_text)
        envelope(value_text)
        texts = (f"{key_text.fstring() if schema.key_indexes else 'None'}, "
                 f"{value_text.fstring()}")
        if shape == "events":
            lines.append(f"    return emit(lsn, data, {texts})")
        else:
            lines += ["    total = orders.total = orders.total + 1",
                      "    order = cell[0] = cell[0] + 1",
                      f"    return make_record(destination, {texts}, None, make_event, lsn, "
                      "total, order, data)"]
    else:
        line = _Pieces(namespace, "L")
        line.literal('{"key":')
        key(line)
        line.literal(',"value":')
        envelope(line)
        if op == "d" and options.tombstones_on_delete and schema.key_indexes:
            line.literal('{"key":')
            key(line)
            line.literal(',"value":null}\n')
        lines.append(f"    return {line.fstring()}")
    exec("\n".join(lines), namespace)
    return namespace["fused"]
