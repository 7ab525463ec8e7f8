"""Debezium JSON change events -> change rows (MISSION K4).

Accepts the ``value`` of what Debezium 3.x's PostgreSQL connector emits through Kafka
Connect's ``JsonConverter`` — ``schemas.enable=false`` (the bare envelope, as ``tidemark
capture`` writes it) or ``true`` (``{"schema": …, "payload": …}``) — and decodes the
column values back to the Arrow types of the caller's table schema:

* precise decimals (base64 of the unscaled two's-complement bytes, or Debezium's
  ``{"scale", "value"}`` struct) -> ``decimal128`` at the schema's scale;
* dates (epoch days), times, timestamps and durations (integers) -> the Arrow type;
  an integer is read in the unit the envelope schema names (``io.debezium.time.Timestamp``
  = ms, ``MicroTimestamp`` = µs, …) when there is one, else in the Arrow type's unit;
  ISO strings (``ZonedTimestamp``) are parsed;
* bytes (base64) -> binary; arrays element by element;
* ``__debezium_unavailable_value`` (in any of its per-type shapes) -> null, with the
  column named in ``_unavailable``.

Tombstones (null values), transaction BEGIN/END records, heartbeats and logical
decoding messages are skipped.

Order. ``apply_changes`` orders changes by ``(_commit_lsn, _seq)`` within a batch and,
through the table's high-water mark, across batches, so these must follow commit order
globally, not just within one call. tidemark's ``transaction.commit_lsn`` and
``total_order`` are exactly that. Debezium's own events carry no commit LSN; their
``source.sequence`` is ``[lastCommitLsn, lsn]``, where ``lastCommitLsn`` is the LSN of the
commit processed before the event. It is the same for every event of a transaction and
grows from one transaction to the next in commit order, so there ``_commit_lsn`` is that
previous commit's LSN plus one (1 before the first), a snapshot read's the LSN itself,
and ``_seq`` orders by the change's own LSN (twice the LSN, plus one for anything but a
delete: a primary-key change is a delete and a create at one LSN). A read shares its
last commit with the next transaction: the one apart puts it before that transaction in
every comparison, an SCD type 2 version's start included, which compares ``_commit_lsn``
alone (two commits are always more than a byte apart, so the order of transactions is
kept). The change's own LSN alone is not commit order: a transaction that
began earlier can commit later, and its changes would sort before those of transactions
already applied and be skipped. An event with neither is refused rather than guessed at.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import msgspec
import pyarrow as pa

from tidemark.errors import ConfigError, TerminalError
from tidemark.lake import change_rows as cr

log = logging.getLogger(__name__)

PLACEHOLDER: Final = "__debezium_unavailable_value"
_PLACEHOLDER_B64: Final = base64.b64encode(PLACEHOLDER.encode()).decode()
_PLACEHOLDER_SHAPES: Final = (PLACEHOLDER, _PLACEHOLDER_B64, [PLACEHOLDER],
                              list(PLACEHOLDER.encode()))
_ROW_OPS: Final = frozenset("curdt")
_DECIMAL_MODES: Final = ("precise", "string", "double")
_EPOCH_DATE: Final = dt.date(1970, 1, 1)

#: Debezium semantic type name -> the unit its integer is in (per second).
_SEMANTIC_UNITS: Final = {
    "io.debezium.time.Timestamp": 1_000, "io.debezium.time.MicroTimestamp": 1_000_000,
    "io.debezium.time.NanoTimestamp": 1_000_000_000, "io.debezium.time.Time": 1_000,
    "io.debezium.time.MicroTime": 1_000_000, "io.debezium.time.NanoTime": 1_000_000_000,
    "io.debezium.time.MicroDuration": 1_000_000, "io.debezium.time.NanoDuration": 1_000_000_000,
    "org.apache.kafka.connect.data.Timestamp": 1_000,
    "org.apache.kafka.connect.data.Time": 1_000,
}
_ARROW_UNITS: Final = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


class DebeziumInputError(TerminalError):
    """A Debezium event that cannot be turned into a change row (names the event)."""


Decoder = Callable[[Any], Any]


def _rescale(per_second: int, unit: str) -> Decoder:
    target = _ARROW_UNITS[unit]
    if per_second == target:
        return int
    if per_second < target:
        factor = target // per_second
        return lambda v: int(v) * factor
    divisor = per_second // target
    return lambda v: int(v) // divisor


def _parse_instant(text: str, per_unit: int) -> int | None:
    if text in ("infinity", "-infinity"):
        return None
    moment = dt.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    delta = moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return micros * per_unit // 1_000_000


def _parse_clock(text: str, per_unit: int) -> int:
    clock = dt.time.fromisoformat(text.rstrip("Z"))
    micros = ((clock.hour * 60 + clock.minute) * 60 + clock.second) * 1_000_000 \
        + clock.microsecond
    return micros * per_unit // 1_000_000


#: Wide enough for any Arrow decimal (76 digits) with room to spare: the default context's
#: 28 digits made quantize() fail on a DECIMAL(30, 0) value (and scaleb() round it).
_WIDE = decimal.Context(prec=160)


def _decimal_decoder(scale: int, text_is_base64: bool) -> Decoder:
    quantum = decimal.Decimal(1).scaleb(-scale, _WIDE)

    def decode(value: Any) -> decimal.Decimal | None:
        if isinstance(value, str):
            # "1234" is valid base64 too: the mode, not the text, says which it is.
            if text_is_base64:
                try:  # base64 of the unscaled value (decimal.handling.mode=precise)
                    raw = base64.b64decode(value, validate=True)
                    return decimal.Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(
                        -scale, _WIDE)
                except ValueError:
                    pass  # not base64 at all: read it as a number
            number = decimal.Decimal(value)
        elif isinstance(value, dict):  # VariableScaleDecimal
            raw = base64.b64decode(value["value"])
            number = decimal.Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(
                -int(value["scale"]), _WIDE)
        else:
            number = decimal.Decimal(str(value))  # double mode
        if not number.is_finite():
            return None
        return number.quantize(quantum, context=_WIDE)

    return decode


def _temporal(per_unit: int, semantic: str | None, parse: Callable[[str, int], Any],
              unit: str) -> Decoder:
    from_int = _rescale(_SEMANTIC_UNITS.get(semantic or "", per_unit), unit)

    def decode(value: Any) -> Any:
        return parse(value, per_unit) if isinstance(value, str) else from_int(value)

    return decode


def _decoder(kind: pa.DataType, semantic: str | None = None,
             decimal_mode: str = "precise") -> Decoder:
    """A function from a JSON value (never None) to what ``pa.array`` takes for *kind*."""
    if pa.types.is_floating(kind):
        return float  # also "NaN", "Infinity", "-Infinity"
    if pa.types.is_integer(kind):
        return int
    if pa.types.is_boolean(kind):
        return bool
    if pa.types.is_decimal(kind):
        precise = decimal_mode == "precise" if semantic is None else \
            semantic in ("org.apache.kafka.connect.data.Decimal",
                         "io.debezium.data.VariableScaleDecimal")
        return _decimal_decoder(kind.scale, precise)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return lambda v: v if isinstance(v, str) else msgspec.json.encode(v).decode()
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return lambda v: base64.b64decode(v) if isinstance(v, str) else bytes(v)
    if pa.types.is_date32(kind):
        return lambda v: dt.date.fromisoformat(v) if isinstance(v, str) else \
            _EPOCH_DATE + dt.timedelta(days=v)
    if pa.types.is_timestamp(kind):
        return _temporal(_ARROW_UNITS[kind.unit], semantic, _parse_instant, kind.unit)
    if pa.types.is_time(kind):
        return _temporal(_ARROW_UNITS[kind.unit], semantic, _parse_clock, kind.unit)
    if pa.types.is_duration(kind):
        return _rescale(_SEMANTIC_UNITS.get(semantic or "", _ARROW_UNITS[kind.unit]), kind.unit)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        element = _decoder(kind.value_type, semantic, decimal_mode)
        return lambda v: [None if e is None else element(e) for e in v]
    if pa.types.is_struct(kind):
        fields = [(f.name, _decoder(f.type, None, decimal_mode)) for f in kind]
        return lambda v: {n: None if v.get(n) is None else d(v[n]) for n, d in fields}
    return lambda v: v


def _semantic_names(envelope_schema: Any) -> dict[str, str]:
    """Column -> Debezium semantic type name (``type:<connect type>`` for a column
    without one), from a ``schemas.enable=true`` envelope."""
    names: dict[str, str] = {}
    for part in envelope_schema.get("fields", ()):
        if part.get("field") in ("before", "after"):
            for column in part.get("fields", ()):
                typed = column  # for an array, the elements' type decides
                if column.get("type") == "array":
                    typed = column.get("items") or {}
                names[column.get("field", "")] = typed.get("name") or f"type:{typed.get('type')}"
    return names


def _is_placeholder(value: Any) -> bool:
    cls = value.__class__
    return (cls is str or cls is list) and value in _PLACEHOLDER_SHAPES


def changes_from_debezium_json(values: Iterable[bytes | str | dict[str, Any] | None],
                               schema: pa.Schema, *,
                               decimal_handling_mode: str = "precise") -> pa.Table:
    """Change rows (:mod:`tidemark.lake.change_rows`) for the table with *schema* from
    Debezium JSON envelope values (JSON text, or already decoded), in input order.

    *decimal_handling_mode* is the connector's (``precise``: decimals are base64
    strings; ``string``: decimal text; ``double``: numbers); the envelope schema, when
    the events carry one, decides per column instead.
    """
    if decimal_handling_mode not in _DECIMAL_MODES:
        raise ConfigError("decimal_handling_mode", f"must be one of {', '.join(_DECIMAL_MODES)}, "
                                                   f"got {decimal_handling_mode!r}")
    names = [f.name for f in schema if f.name not in cr.METADATA_COLUMNS]
    decoders = [_decoder(schema.field(n).type, None, decimal_handling_mode) for n in names]
    semantic_seen = False
    columns: list[list[Any]] = [[] for _ in names]
    ops: list[str] = []
    lsns: list[int | None] = []
    commit_lsns: list[int | None] = []
    seqs: list[int] = []
    commit_ts: list[int | None] = []
    txids: list[int | None] = []
    unavailable: list[list[str] | None] = []
    decode_json = msgspec.json.Decoder().decode
    decode_sequence = msgspec.json.Decoder(list[str | None]).decode
    position = 0
    for number, value in enumerate(values):
        if value is None:
            continue  # a tombstone
        try:
            event = value if isinstance(value, dict) else decode_json(value)
        except msgspec.DecodeError as err:
            raise DebeziumInputError(f"event {number} is not JSON: {err}") from err
        if not isinstance(event, dict):
            continue  # JSON null (tombstone) or not an envelope
        if "payload" in event and "schema" in event:
            if not semantic_seen and event["schema"]:
                semantics = _semantic_names(event["schema"])
                decoders = [_decoder(schema.field(n).type, semantics.get(n),
                                     decimal_handling_mode) for n in names]
                semantic_seen = True
            event = event["payload"]
            if not isinstance(event, dict):
                continue
        op = event.get("op")
        if op not in _ROW_OPS:
            continue  # BEGIN/END, heartbeats, logical decoding messages
        position += 1
        source = event.get("source") or {}
        transaction = event.get("transaction") or {}
        row = event.get("before") if op == "d" else event.get("after")
        if op != "t" and not isinstance(row, dict):
            raise DebeziumInputError(f"event {number} (op {op!r}) has no "
                                     f"{'before' if op == 'd' else 'after'} row")
        missing: list[str] = []
        for i, name in enumerate(names):
            raw = None if row is None else row.get(name)
            if raw is not None and _is_placeholder(raw):
                missing.append(name)
                raw = None
            try:
                columns[i].append(None if raw is None else decoders[i](raw))
            except (ValueError, TypeError, KeyError, ArithmeticError) as err:
                raise DebeziumInputError(f"event {number}: column {name!r} value {raw!r} "
                                         f"does not decode to {schema.field(name).type}: "
                                         f"{err}") from err
        lsn = source.get("lsn")
        commit_lsn = transaction.get("commit_lsn")
        if commit_lsn is not None:
            order = commit_lsn, transaction.get("total_order") or position
        else:
            order = _order_from_sequence(source, op, number, decode_sequence)
            if op == "r" and source.get("snapshot") not in (None, "false", "incremental"):
                # An initial snapshot's reads come before every streamed change; the first
                # streamed transaction may share their (null) last commit and hold changes
                # at LSNs below the snapshot's.
                order = order[0], 0
        ops.append(op)
        lsns.append(lsn)
        commit_lsns.append(order[0])
        seqs.append(order[1])
        ts_us = transaction.get("commit_ts_us", source.get("ts_us"))
        if ts_us is None and source.get("ts_ms") is not None:
            ts_us = source["ts_ms"] * 1000
        commit_ts.append(ts_us)
        txids.append(source.get("txId"))
        unavailable.append(missing)
    arrays = [pa.array(col, type=schema.field(n).type) for n, col in zip(names, columns,
                                                                         strict=True)]
    meta = [ops, lsns, commit_lsns, seqs, commit_ts, txids, unavailable]
    arrays += [pa.array(v, type=f.type) for v, f in zip(meta, cr.METADATA_FIELDS, strict=True)]
    fields = [schema.field(n) for n in names] + list(cr.METADATA_FIELDS)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _order_from_sequence(source: dict[str, Any], op: str, number: int,
                         decode_sequence: Callable[[str | bytes], list[str | None]]
                         ) -> tuple[int, int]:
    """``(_commit_lsn, _seq)`` of a Debezium event from its ``source.sequence``."""
    raw = source.get("sequence")
    lsn = source.get("lsn")
    if raw is None or lsn is None:
        raise DebeziumInputError(
            f"event {number} has no transaction.commit_lsn and no "
            f"source.{'sequence' if raw is None else 'lsn'}, so its commit order cannot be "
            f"known (ordering by the change's own LSN would skip transactions that began "
            f"earlier but committed later); expected Debezium's PostgreSQL source block "
            f"(source.sequence = [lastCommitLsn, lsn]) or tidemark capture's events")
    try:
        sequence = decode_sequence(raw) if isinstance(raw, str | bytes) else list(raw)
        last_commit, _ = sequence
        commit = 0 if last_commit is None else int(last_commit)
        position = int(lsn)
    except (msgspec.DecodeError, ValueError, TypeError) as err:
        raise DebeziumInputError(f"event {number}: source.sequence {raw!r} is not "
                                 f"[lastCommitLsn, lsn] (two decimal LSNs as text): "
                                 f"{err}") from err
    # A primary-key change is a delete and a create at one LSN: the delete comes first.
    return commit + (op != "r"), position * 2 + (op != "d")


def debezium_values_from_lines(lines: Iterable[bytes | str]) -> Iterator[dict[str, Any] | None]:
    """The ``value`` of each ``{"key": …, "value": …}`` line (``tidemark capture``'s
    output, or a Kafka topic dumped with keys); a bare envelope line is its own value."""
    decode_json = msgspec.json.Decoder().decode
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = decode_json(line)
        except msgspec.DecodeError as err:
            raise DebeziumInputError(f"line {number + 1} is not JSON: {err}") from err
        if isinstance(record, dict) and "value" in record and "op" not in record:
            yield record["value"]
        else:
            yield record


def changes_from_debezium_file(path: str | os.PathLike[str], schema: pa.Schema, *,
                               decimal_handling_mode: str = "precise") -> pa.Table:
    """Change rows from a file of Debezium JSON lines (e.g. ``tidemark capture`` output)."""
    with open(path, "rb") as lines:
        return changes_from_debezium_json(debezium_values_from_lines(lines), schema,
                                          decimal_handling_mode=decimal_handling_mode)
