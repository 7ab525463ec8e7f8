"""Generated writers of one table schema's Debezium JSON: straight-line Python code per
schema (:func:`compile_row_converter`, :func:`compile_event_renderer`) and the same
writer in C (:func:`compiled_event_renderer`, ``tidemark.serde._render``), all built
from the per-column decisions of :mod:`tidemark.serde.json_columns`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, NamedTuple

from tidemark.event import (
    UNAVAILABLE,
    ChangeEvent,
    Column,
    SnapshotMarker,
    SourceContext,
    TableSchema,
)
from tidemark.serde.json_columns import (
    TEMPLATE_NAMES,
    DebeziumJsonOptions,
    RowConverter,
    _column_writer,
    _compiled_kind,
    _escape,
    column_fragment,
    json_fragment,
)

try:
    from tidemark.serde._render import EventRenderer as _CompiledRenderer
except ImportError:  # not built: the generated Python code writes the same JSON
    _CompiledRenderer = None  # type: ignore[assignment,misc]

#: Whether the compiled event writer (``tidemark.serde._render``) is built.
COMPILED_RENDERER: Final = _CompiledRenderer is not None


def _row_code(columns: list[Column], options: DebeziumJsonOptions, namespace: dict[str, Any],
              row: str, prefix: str) -> tuple[list[str], list[str]]:
    """Generated statements that turn the wire tuple named *row* into one JSON text
    fragment per column, in variables ``<prefix>f<i>``: (statements, fragment names).

    Binding names (``n<i>``, ``p<i>``, ``c<i>``) go into *namespace*, shared by every
    row of the schema that uses the same *namespace*.
    """
    if not columns:
        return [], []
    values = [f"{prefix}v{i}" for i in range(len(columns))]
    lines = [f"{', '.join(values)}{',' if len(columns) == 1 else ''} = {row}"]
    fragments = []
    for i, column in enumerate(columns):
        template, function, null_text, placeholder = column_fragment(column, options)
        namespace[f"p{i}"] = json_fragment(placeholder)
        namespace[f"n{i}"] = null_text
        v = values[i]
        if template is not None:
            expr = template.format(v=v)
        else:
            namespace[f"c{i}"] = function
            expr = f"c{i}({v})"
        lines.append(
            f"{prefix}f{i} = {expr} if {v}.__class__ is str else "
            f"(n{i} if {v} is None else p{i} if {v} is _UNAVAILABLE else _bin({v}))"
        )
        fragments.append(f"{prefix}f{i}")
    return lines, fragments


def _object_template(columns: list[Column], indexes: Iterable[int], fragments: list[str],
                     namespace: dict[str, Any], label: str) -> str:
    """The f-string body of a JSON object of the given columns' fragments.

    Column names are data, never code: the literal JSON text around each value lives
    in a variable (``<label><i>``) of the generated function's namespace.
    """
    parts = []
    for n, i in enumerate(indexes):
        namespace[f"{label}{i}"] = _member_prefix(n, columns[i].name)
        parts.append(f"{{{label}{i}}}{{{fragments[i]}}}")
    return "".join(parts) + "}}" if parts else "{{}}"


def _namespace() -> dict[str, Any]:
    # Binary-format values (only from sources that request binary transfer) are raw
    # bytes, emitted as Debezium emits bytes: base64.
    return {"_UNAVAILABLE": UNAVAILABLE, "_bin": json_fragment, **TEMPLATE_NAMES}


def compile_row_converter(
    columns: Iterable[Column], options: DebeziumJsonOptions, only: Iterable[int] | None = None
) -> RowConverter:
    """Generate ``tuple of wire values -> JSON object text`` for a table schema.

    Straight-line code per schema that writes JSON text directly: a generic per-column
    loop, or building dicts for an encoder, costs more than everything else on the
    capture path, and this runs for every row of every event.
    """
    columns = list(columns)
    if not columns:
        return lambda row: "{}"
    indexes = list(range(len(columns))) if only is None else list(only)
    namespace = _namespace()
    body, fragments = _row_code(columns, options, namespace, "r", "")
    template = _object_template(columns, indexes, fragments, namespace, "k")
    lines = ["def convert(r):", *(f"    {line}" for line in body),
             f'    return f"{template}"']
    exec("\n".join(lines), namespace)
    convert: RowConverter = namespace["convert"]
    return convert


#: ``event -> (key JSON text or "null", value JSON text)``, as
#: :meth:`DebeziumJsonSerializer.key_and_value` returns them.
EventRenderer = Callable[[ChangeEvent], tuple[str, str]]


def compile_event_renderer(schema: TableSchema, options: DebeziumJsonOptions,
                           source_parts: Callable[[SourceContext, SnapshotMarker],
                                                  tuple[str, ...]],
                           ts_fields: Callable[[int], str],
                           transaction: Callable[[ChangeEvent], str],
                           general: EventRenderer, *, compiled: bool = True) -> EventRenderer:
    """Generate the key and value writer of one table schema's row events.

    One frame per event, with the before and after rows, the key (the key columns'
    fragments of the row already written) and the cached ``source`` block inline:
    the per-piece functions cost more in calls than in writing JSON. The pieces that
    change rarely come from the serializer's own code: *source_parts* (the ``source``
    block around the LSN), *ts_fields* (the value's ``ts_*`` fields and closing brace)
    and *transaction* (the ``transaction`` block, with transaction metadata). Events
    without an LSN go to *general* (the reference implementation, which the tests hold
    this code to).

    With *compiled* (and the C extension built), the same writer in C
    (:func:`compiled_event_renderer`), which the tests hold to this code's output.
    """
    columns = list(schema.columns)
    if compiled and COMPILED_RENDERER and columns:
        return compiled_event_renderer(schema, options, source_parts, ts_fields, transaction,
                                       general)
    namespace = _namespace()
    # The cache between events, a list because that is the cheapest mutable cell for
    # the generated code to read: [0] context and [1] snapshot marker of the last
    # event, [2:5] its source block around the LSN, [5] its timestamp, [6] its ts
    # fields, [7] whether the LSN goes into the source block (else [2] is all of it).
    state: list[Any] = [None, None, "", "", "", None, "", True]

    def refresh_source(context: SourceContext, snapshot: SnapshotMarker) -> None:
        parts = source_parts(context, snapshot)
        state[0:5] = [context, snapshot, *parts, "", ""][:5]
        state[7] = len(parts) == 3

    def refresh_ts(ts_us: int) -> None:
        state[5:7] = [ts_us, ts_fields(ts_us)]

    namespace.update(st=state, refresh_source=refresh_source, refresh_ts=refresh_ts,
                     general=general, tx=transaction)
    lines = [
        "def render(e):",
        "    lsn = e.lsn",
        "    if lsn is None:",
        "        return general(e)",
        "    context = e.context",
        "    snapshot = e.snapshot",
        "    if context is not st[0] or snapshot is not st[1]:",
        "        refresh_source(context, snapshot)",
        "    ts = e.ts_us",
        "    if ts != st[5]:",
        "        refresh_ts(ts)",
        "    op = e.op._value_",
    ]
    texts = {}
    for name, prefix in (("after", "a"), ("before", "b")):
        body, fragments = _row_code(columns, options, namespace, "row", prefix)
        template = _object_template(columns, range(len(columns)), fragments, namespace, "k")
        texts[name] = fragments
        lines += [f"    row = e.raw_{name}",
                  "    if row is None:",
                  f'        {name} = "null"',
                  "    else:",
                  *(f"        {line}" for line in body),
                  f'        {name} = f"{template}"']
    if schema.key_indexes:
        keys = schema.key_indexes
        before_key = _object_template(columns, keys, texts["before"], namespace, "kk")
        after_key = _object_template(columns, keys, texts["after"], namespace, "kk")
        lines += ['    if op == "d":',
                  f'        key = "null" if before == "null" else f"{before_key}"',
                  '    elif op == "t" or after == "null":',
                  '        key = "null"',
                  "    else:",
                  f'        key = f"{after_key}"']
    else:
        lines.append('    key = "null"')
    transaction_text = "{tx(e)}" if options.transaction_metadata else "null"
    lines += [
        '    source = f"{st[2]}{lsn}{st[3]}{lsn}{st[4]}" if st[7] else st[2]',
        '    return key, f\'{{"before":{before},"after":{after},"source":{source}'
        f',"transaction":{transaction_text},'
        '"op":"{op}",{st[6]}\'',
    ]
    exec("\n".join(lines), namespace)
    render: EventRenderer = namespace["render"]
    return render


def compiled_event_renderer(schema: TableSchema, options: DebeziumJsonOptions,
                            source_parts: Callable[[SourceContext, SnapshotMarker],
                                                   tuple[str, ...]],
                            ts_fields: Callable[[int], str],
                            transaction: Callable[[ChangeEvent], str],
                            general: EventRenderer) -> EventRenderer:
    """:func:`compile_event_renderer`'s writer in C (``tidemark.serde._render``), from
    the same per-column decisions; raises ImportError where the extension is not built.
    """
    if _CompiledRenderer is None:
        raise ImportError("tidemark.serde._render is not built (no C compiler at install?)")
    c = compiled_columns(schema, options)
    return _CompiledRenderer(
        kinds=c.kinds, params=c.params, functions=c.functions, names=c.names,
        nulls=c.nulls, placeholders=c.placeholders, key_indexes=tuple(schema.key_indexes),
        key_names=c.key_names, unavailable=UNAVAILABLE, binary=json_fragment,
        escape=_escape, general=general, source_parts=source_parts, ts_fields=ts_fields,
        transaction=transaction if options.transaction_metadata else None,
    )


class CompiledColumns(NamedTuple):
    """How the compiled writer writes each column of a schema (``_render.c``'s kinds)."""

    kinds: bytes
    """Per column: KIND_RAW, KIND_STRING, ... (json_columns, json_values)."""
    params: bytes
    """Per column: the kind's parameter (a decimal's scale, a timestamp's digits)."""
    functions: tuple[Callable[[str], str] | None, ...]
    names: tuple[str, ...]
    """The JSON text before each column's value: ``{"id":``, then ``,"x":``."""
    nulls: tuple[str, ...]
    placeholders: tuple[str, ...]
    key_names: tuple[str, ...]
    """The same as names, for the key's columns."""


def compiled_columns(schema: TableSchema, options: DebeziumJsonOptions) -> CompiledColumns:
    """The per-column decisions the compiled writer of *schema* is built from (also for
    a source's own compiled writer of the same text, MariaDB's rows_lines)."""
    columns = schema.columns
    writers = [_column_writer(column, options) for column in columns]
    kinds = [_compiled_kind(kind, function) for kind, _, function, *_ in writers]
    return CompiledColumns(
        kinds=bytes(kind for kind, _ in kinds), params=bytes(param for _, param in kinds),
        functions=tuple(function for _, _, function, _, _ in writers),
        names=tuple(_member_prefix(n, column.name) for n, column in enumerate(columns)),
        nulls=tuple(null_text for *_, null_text, _ in writers),
        placeholders=tuple(json_fragment(placeholder) for *_, placeholder in writers),
        key_names=tuple(_member_prefix(n, columns[i].name)
                        for n, i in enumerate(schema.key_indexes)))


def _member_prefix(position: int, name: str) -> str:
    """The JSON text before an object's member value: ``{"name":`` or ``,"name":``."""
    return ("{" if position == 0 else ",") + _escape(name) + ":"


