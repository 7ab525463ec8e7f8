"""Unit tests of the Spark source's pure parts: offsets, batch cutting, decoding to Arrow.

No Spark session and no database: pgoutput messages are built with the test encoder.
"""

from __future__ import annotations

import datetime as dt
import itertools
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    TimestampType,
)

from pgoutput_builders import encode_message
from tidemark.errors import ConfigError
from tidemark.event import UNAVAILABLE, TableId
from tidemark.source.postgres import pgoutput
from tidemark.source.postgres import types as pg
from tidemark.source.postgres.pgoutput import (
    Begin,
    Commit,
    DecodeError,
    Delete,
    Insert,
    Relation,
    RelationColumn,
    Truncate,
    Update,
)
from tidemark.source.postgres.pgoutput_walk import TransactionWalker
from tidemark.source.postgres.read_plan import MIN_SLICE_BYTES, PostgresReadPlan
from tidemark.source.postgres.stream_offsets import (
    OffsetError,
    TxnIndex,
    TxnSummary,
    end_for_limit,
    from_offset,
    split_range,
    to_offset,
)
from tidemark.source.postgres.tuple_columns import TupleLayoutError, decode_tuples, join_messages
from tidemark.spark.arrow_rows import (
    EnvelopeSink,
    PackedEnvelopeSink,
    StructEnvelopeSink,
    TypedSink,
)
from tidemark.spark.change_schemas import (
    PACKED_SCHEMA,
    SchemaChangedError,
    arrow_schema,
    struct_envelope_schema,
    typed_rows,
    typed_schema,
)
from tidemark.spark.options import OnSchemaChange, SourceOptions
from tidemark.spark.type_mapping import spark_type

TABLE = TableId("public", "a")
REL = Relation(None, 16384, "public", "a", "d", (
    RelationColumn("id", pg.INT4_OID, -1, True),
    RelationColumn("amount", pg.NUMERIC_OID, (12 << 16 | 2) + 4, False),
    RelationColumn("note", pg.TEXT_OID, -1, False),
))
SCHEMA = typed_schema([StructField("id", IntegerType()), StructField("amount", DecimalType(12, 2)),
                       StructField("note", StringType())])


# -- offsets and cutting ----------------------------------------------------------------
def test_offsets_round_trip_and_reject_foreign_offsets() -> None:
    assert from_offset(to_offset(0x16_B374D848)) == 0x16_B374D848
    assert to_offset(0x16_B374D848) == {"lsn": "16/B374D848"}
    with pytest.raises(OffsetError, match="not a tidemark offset"):
        from_offset({"offset": 3})


@given(st.integers(0, 2**40), st.integers(0, 10_000), st.integers(1, 16))
def test_split_range_covers_the_range_with_adjacent_slices(start: int, length: int,
                                                           parts: int) -> None:
    slices = split_range(start, start + length, parts)
    if length == 0:
        assert slices == []
        return
    assert slices[0][0] == start and slices[-1][1] == start + length
    assert all(lo < hi for lo, hi in slices)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(slices))
    assert len(slices) == min(parts, length)


def test_small_batches_are_not_cut_into_partitions() -> None:
    options = SourceOptions.parse({"dsn": "host=h", "table": "public.a"}, default_partitions=4)
    plan = PostgresReadPlan(options)
    start = 0x1_0000_0000

    def slices(size: int) -> list[tuple[int, int]]:
        return [(p.lo, p.hi) for p in plan.plan(to_offset(start), to_offset(start + size))]

    assert slices(1000) == [(start, start + 1000)]  # a connection, not four
    assert len(slices(2 * MIN_SLICE_BYTES)) == 2
    whole = slices(100 * MIN_SLICE_BYTES)
    assert len(whole) == 4 and whole[0][0] == start and whole[-1][1] == start + 100 * (
        MIN_SLICE_BYTES)
    assert slices(0) == []


def test_end_for_limit_takes_whole_transactions_and_at_least_one() -> None:
    txns = [TxnSummary(100, 3), TxnSummary(200, 3), TxnSummary(300, 3)]
    assert end_for_limit(txns, 100, 6) == 201  # two whole transactions
    assert end_for_limit(txns, 100, 5) == 101  # the second does not fit
    assert end_for_limit(txns, 100, 1) == 101  # a transaction over the limit still goes
    assert end_for_limit(txns, 150, 100) == 301  # transactions before start ignored
    assert end_for_limit(txns, 301, 100) is None


def test_txn_index_plans_only_batches_it_can_see_whole() -> None:
    index = TxnIndex(100, 400, [TxnSummary(100, 3), TxnSummary(200, 3), TxnSummary(300, 3)])
    assert index.plan(100, 4) == 101  # more than the limit known: the batch is full
    assert index.plan(201, 4) is None  # only 3 known after 201: more may come after 400
    assert not index.covers(400)


# -- options ----------------------------------------------------------------------------
def test_options_unknown_key_names_it_and_the_allowed_ones() -> None:
    with pytest.raises(ConfigError) as err:
        SourceOptions.parse({"dsn": "host=x", "tables": "public.a", "maxChangePerTrigger": "5"})
    assert "maxChangePerTrigger" in str(err.value)
    assert "maxChangesPerTrigger" in str(err.value)


@pytest.mark.parametrize(("options", "key"), [
    ({"tables": "public.a"}, "dsn"),
    ({"dsn": "host=x"}, "tables"),
    ({"dsn": "host=x", "tables": "public.a", "maxchangespertrigger": "0"}, "maxChangesPerTrigger"),
    ({"dsn": "host=x", "tables": "public.a", "slot": "Bad-Name"}, "slot"),
    ({"dsn": "host=x", "tables": "public.a", "onSchemaChange": "ignore"}, "onSchemaChange"),
    ({"dsn": "host=x", "table": "public.a", "tables": "public.b"}, "tables"),
])
def test_options_bad_values_name_the_option(options: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        SourceOptions.parse(options)
    assert err.value.key == key


def test_options_repr_hides_the_password() -> None:
    options = SourceOptions.parse({"dsn": "host=x password=hunter2", "table": "public.a"})
    assert "hunter2" not in repr(options)
    assert options.tables == (TABLE,) and options.max_changes_per_trigger is None


# -- decoding ---------------------------------------------------------------------------
def _txn(commit_lsn: int, xid: int, *msgs: object) -> list[tuple[int, bytes]]:
    begin = Begin(commit_lsn, 1_700_000_000_000_000, xid)
    commit = Commit(0, commit_lsn, commit_lsn + 8, 1_700_000_000_000_000)
    rows = [(commit_lsn - 100, encode_message(begin))]
    rows += [(commit_lsn - 50 + i, encode_message(m)) for i, m in enumerate(msgs)]  # type: ignore[arg-type]
    rows.append((commit_lsn + 8, encode_message(commit)))
    return rows


def _typed(lo: int, hi: int, chunks: list[list[tuple[int, bytes]]],
           on_change: OnSchemaChange = OnSchemaChange.FAIL, batch_rows: int = 2) -> pa.Table:
    """The typed rows of the walk (one table chunk per record batch); tiny batches by
    default, to exercise flushing."""
    sink = TypedSink(TABLE, SCHEMA, batch_rows, on_change)
    walker = TransactionWalker(lo, hi, sink)
    batches = []
    for chunk in chunks:
        walker.feed(chunk)
        batches.extend(sink.take())
    batches.extend(sink.finish())
    return pa.Table.from_batches(batches, schema=sink.pa_schema)


def test_walker_keeps_transactions_by_commit_lsn_and_splits_key_changes() -> None:
    rel = [(1, encode_message(REL))]
    t1 = _txn(1000, 7, Insert(None, REL.relation_id, ("1", "12.30", "x")),
              Update(None, REL.relation_id, "K", ("1", None, None), ("2", "12.30", UNAVAILABLE)))
    t2 = _txn(2000, 8, Delete(None, REL.relation_id, "K", ("2", None, None)),
              Truncate(None, False, False, (REL.relation_id,)))
    # t1's changes have LSNs below 950 but it commits at 1000: it belongs to [1000, 2000)
    # in full, and to nothing below; chunks cut through the middle of a transaction.
    messages = rel + t1 + t2
    chunks = [messages[:3], messages[3:6], messages[6:]]
    first = _typed(1000, 2000, chunks)
    assert first.column("_op").to_pylist() == ["c", "d", "c"]
    assert first.column("_seq").to_pylist() == [1, 2, 3]
    assert first.column("id").to_pylist() == [1, 1, 2]
    assert first.column("amount").to_pylist() == [Decimal("12.30"), None, Decimal("12.30")]
    assert first.column("_unavailable").to_pylist() == [[], [], ["note"]]
    assert first.column("note").to_pylist() == ["x", None, None]
    assert set(first.column("_commit_lsn").to_pylist()) == {1000}
    assert set(first.column("_txid").to_pylist()) == {7}
    assert first.column("_commit_ts").type == pa.timestamp("us", tz="UTC")
    assert first.column("_commit_ts")[0].as_py() == dt.datetime(2023, 11, 14, 22, 13, 20,
                                                                tzinfo=dt.UTC)
    assert _typed(0, 1000, chunks).num_rows == 0
    second = _typed(1001, 2001, chunks)
    assert second.column("_op").to_pylist() == ["d", "t"]
    assert second.column("id").to_pylist() == [2, None]
    # Replaying a range gives the same rows.
    assert _typed(1000, 2000, [messages]).equals(first)


def test_new_column_fails_with_restart_advice_or_is_dropped() -> None:
    grown = Relation(None, REL.relation_id, "public", "a", "d",
                     (*REL.columns, RelationColumn("extra", pg.INT8_OID, -1, False)))
    messages = [(1, encode_message(grown)),
                *_txn(1000, 7, Insert(None, REL.relation_id, ("1", "1.00", "x", "5")))]
    with pytest.raises(SchemaChangedError, match="restart the query"):
        _typed(0, 2000, [messages])
    table = _typed(0, 2000, [messages], OnSchemaChange.DROP_NEW_COLUMNS)
    assert table.column("id").to_pylist() == [1]


def test_envelope_rows_are_json_text_maps() -> None:
    sink = EnvelopeSink([TABLE], 100)
    walker = TransactionWalker(0, 10_000, sink)
    walker.feed([(1, encode_message(REL)),
                 *_txn(1000, 7, Update(None, REL.relation_id, None, None,
                                       ("1", None, UNAVAILABLE)))])
    (batch,) = list(sink.finish())
    row = batch.to_pylist()[0]
    assert row["table"] == "public.a" and row["_op"] == "u"
    assert row["key"] == '{"id":"1"}'
    assert row["after"] == '{"id":"1","amount":null}'
    assert row["_unavailable"] == ["note"]


def test_type_mapping_and_column_conversion() -> None:
    # beyond Spark's 38 digits
    assert spark_type(pg.logical_type(pg.NUMERIC_OID, (40 << 16 | 2) + 4)) == StringType()
    assert spark_type(pg.logical_type(pg.NUMERIC_OID, -1)) == StringType()
    assert spark_type(pg.logical_type(pg.INT8_ARRAY_OID, -1)) == ArrayType(LongType())
    assert spark_type(pg.logical_type(pg.BOOL_OID, -1)) == BooleanType()
    assert spark_type(pg.logical_type(pg.TIMESTAMPTZ_OID, -1)) == TimestampType()
    schema = typed_schema([StructField("ts", TimestampType()), StructField("ok", BooleanType()),
                           StructField("xs", ArrayType(LongType()))])
    rel = Relation(None, 1, "public", "a", "d", (
        RelationColumn("ts", pg.TIMESTAMPTZ_OID, -1, True),
        RelationColumn("ok", pg.BOOL_OID, -1, False),
        RelationColumn("xs", pg.INT8_ARRAY_OID, -1, False)))
    sink = TypedSink(TABLE, schema, 100, OnSchemaChange.FAIL)
    walker = TransactionWalker(0, 10_000, sink)
    walker.feed([(1, encode_message(rel)),
                 *_txn(1000, 7,
                       Insert(None, 1, ("2024-01-02 03:04:05.5+00", "t", "{1,NULL,3}")),
                       Insert(None, 1, ("infinity", "f", None)))])
    (batch,) = list(sink.finish())
    assert batch.column(0).to_pylist()[0] == dt.datetime(2024, 1, 2, 3, 4, 5, 500000,
                                                         tzinfo=dt.UTC)
    assert batch.column(1).to_pylist() == [True, False]
    assert batch.column(2).to_pylist() == [[1, None, 3], None]
    assert batch.column(0).to_pylist()[1].year == 9999  # infinity: the largest timestamp


# -- vectorized tuple decoding ------------------------------------------------------------
_VALUE = st.one_of(st.none(), st.just(UNAVAILABLE), st.text(max_size=40))


@given(st.integers(1, 6).flatmap(
    lambda n: st.lists(st.tuples(*[_VALUE] * n), min_size=1, max_size=30)))
def test_vectorized_tuple_decoding_equals_the_message_decoder(rows: list[tuple[object, ...]]
                                                              ) -> None:
    ncols = len(rows[0])
    messages = [encode_message(Update(None, 7, None, None, r)) if UNAVAILABLE in r
                else encode_message(Insert(None, 7, r)) for r in rows]  # type: ignore[arg-type]
    decoded = decode_tuples(*join_messages(messages), ncols)
    for column in range(ncols):
        assert decoded.arrays[column].to_pylist() == [
            None if r[column] is UNAVAILABLE else r[column] for r in rows]
    assert decoded.unchanged == [(i, [c for c, v in enumerate(r) if v is UNAVAILABLE])
                                 for i, r in enumerate(rows) if UNAVAILABLE in r]


def test_vectorized_decoding_refuses_what_does_not_fit_its_layout() -> None:
    good = encode_message(Insert(None, 7, ("1", "x")))
    with pytest.raises(TupleLayoutError, match="column count"):
        decode_tuples(*join_messages([good]), 3)
    with pytest.raises(TupleLayoutError):
        decode_tuples(*join_messages([good[:-1]]), 2)  # truncated value
    with pytest.raises(TupleLayoutError):
        decode_tuples(*join_messages([good + b"\x00"]), 2)  # trailing byte
    latin1 = encode_message(Insert(None, 7, ("1", "x"))).replace(b"x", b"\xe9")
    with pytest.raises(TupleLayoutError, match="UTF-8"):
        decode_tuples(*join_messages([latin1]), 2)


def test_a_malformed_row_message_fails_with_the_decoders_exact_error() -> None:
    bad = encode_message(Insert(None, REL.relation_id, ("1", "1.00", "x")))[:-1]
    with pytest.raises(DecodeError, match="Insert"):
        _typed(0, 2000, [[(1, encode_message(REL)), *_txn(1000, 7, Insert(
            None, REL.relation_id, ("1", "1.00", "x")))[:1], (5, bad)]])


def test_struct_envelope_rows_equal_the_typed_rows() -> None:
    other = Relation(None, 99, "public", "b", "d", (RelationColumn("k", pg.TEXT_OID, -1, True),))
    messages = [(1, encode_message(REL)), (2, encode_message(other)),
                *_txn(1000, 7, Insert(None, REL.relation_id, ("1", "12.30", "x")),
                      Insert(None, 99, ("k1",)),
                      Update(None, REL.relation_id, "K", ("1", None, None),
                             ("2", "12.30", UNAVAILABLE)),
                      Update(None, REL.relation_id, None, None, ("2", "1.00", UNAVAILABLE))),
                *_txn(2000, 8, Delete(None, REL.relation_id, "K", ("2", None, None)),
                      Truncate(None, False, False, (REL.relation_id, 99)))]
    typed = _typed(0, 3000, [messages])
    schemas = {"public.a": SCHEMA, "public.b": typed_schema([StructField("k", StringType())])}
    for envelope_schema, kind in ((struct_envelope_schema(schemas), StructEnvelopeSink),
                                  (PACKED_SCHEMA, PackedEnvelopeSink)):
        sink = kind(envelope_schema, schemas, 2, OnSchemaChange.FAIL)
        walker = TransactionWalker(0, 3000, sink)
        walker.feed(messages[:4])
        batches = list(sink.take())
        walker.feed(messages[4:])
        batches += sink.finish()
        envelope = pa.Table.from_batches(batches, schema=arrow_schema(envelope_schema))
        assert typed_rows(envelope, "public.a", SCHEMA).to_pylist() == typed.to_pylist()
        assert typed_rows(envelope, "public.b", schemas["public.b"]).column(
            "_op").to_pylist() == ["c", "t"]
    empty = typed_rows(envelope.slice(0, 0), "public.a", SCHEMA)
    assert empty.num_rows == 0 and empty.schema == arrow_schema(SCHEMA)
    assert typed.column("_op").to_pylist() == ["c", "d", "c", "u", "d", "t"]
    assert typed.column("_unavailable").to_pylist() == [[], [], ["note"], ["note"], [], []]


# -- the vectorized walk against a message-by-message reference --------------------------
OTHER = Relation(None, 99, "public", "other", "d", (RelationColumn("k", pg.TEXT_OID, -1, True),))
_NOTE = st.one_of(st.none(), st.just(UNAVAILABLE), st.sampled_from(["x", "é", "a b", ""]))


@st.composite
def _change(draw: st.DrawFn) -> object:
    """One data message of public.a (ids 1-5 so updates can change keys) or of a table
    the stream does not capture, or a Relation message sent again mid-stream."""
    kind = draw(st.sampled_from(["insert", "update", "key_update", "full_update", "delete",
                                 "truncate", "other", "relation"]))
    row = (str(draw(st.integers(1, 5))), draw(st.sampled_from(["1.00", "12.30", None])),
           draw(_NOTE))
    new_only = tuple(None if v is UNAVAILABLE else v for v in row)
    rid = REL.relation_id
    if kind == "insert":
        return Insert(None, rid, new_only)
    if kind == "update":
        return Update(None, rid, None, None, row)
    if kind == "key_update":  # the old key differs from the new one (or not)
        return Update(None, rid, "K", (str(draw(st.integers(1, 5))), None, None), row)
    if kind == "full_update":  # REPLICA IDENTITY FULL: the whole old row
        return Update(None, rid, "O", (row[0], "1.00", "old"), row)
    if kind == "delete":
        return Delete(None, rid, "K", (row[0], None, None))
    if kind == "truncate":
        return Truncate(None, False, False, (rid, OTHER.relation_id))
    if kind == "other":
        return Insert(None, OTHER.relation_id, ("k",))
    return REL


def _reference(messages: list[tuple[int, bytes]], lo: int, hi: int
               ) -> list[tuple[object, ...]]:
    """The rows of public.a the walk must give, decoded one message at a time."""
    rows: list[tuple[object, ...]] = []
    keep, seq, txn = False, 0, (0, 0)
    for lsn, data in messages:
        kind = data[:1]
        if kind == b"B":
            begin = pgoutput.parse_begin(data)
            keep, seq, txn = lo <= begin.final_lsn < hi, 0, (begin.final_lsn, begin.xid)
            continue
        if not keep or kind not in b"IUDT":
            continue
        changes: list[tuple[str, tuple[object, ...] | None, int]] = []
        if kind == b"I":
            ins = pgoutput.parse_insert(data)
            changes.append(("c", ins.new, ins.relation_id))
        elif kind == b"D":
            dele = pgoutput.parse_delete(data)
            changes.append(("d", dele.old, dele.relation_id))
        elif kind == b"T":
            changes += [("t", None, r) for r in pgoutput.parse_truncate(data).relation_ids]
        else:
            upd = pgoutput.parse_update(data)
            new = upd.new
            if upd.old_kind == "O" and upd.old is not None:  # the whole old row: fills in
                new = tuple(o if n is UNAVAILABLE else n
                            for o, n in zip(upd.old, new, strict=True))
            if upd.old is not None and new[0] is not UNAVAILABLE and upd.old[0] != new[0]:
                changes += [("d", upd.old, upd.relation_id), ("c", new, upd.relation_id)]
            else:
                changes.append(("u", new, upd.relation_id))
        for op, values, relation_id in changes:
            seq += 1
            if relation_id != REL.relation_id:
                continue
            cells = (None, None, None) if values is None else values
            rows.append((op, *[None if v is UNAVAILABLE else v for v in cells], lsn, seq,
                         *txn, [n for n, v in zip(("id", "amount", "note"), cells,
                                                  strict=True) if v is UNAVAILABLE]))
    return rows


@given(st.lists(st.lists(_change(), max_size=8), min_size=1, max_size=8),
       st.lists(st.integers(1, 60), max_size=6), st.integers(1, 7), st.integers(0, 9),
       st.integers(0, 9))
def test_vectorized_walk_equals_decoding_message_by_message(
        txns: list[list[object]], cuts: list[int], batch_rows: int, first: int,
        last: int) -> None:
    messages = [(1, encode_message(REL)), (2, encode_message(OTHER))]
    for i, changes in enumerate(txns):
        messages += _txn(1000 * (i + 1), 100 + i, *changes)
    lo, hi = 1000 * first, 1000 * max(first, last) + 1
    points = sorted({0, len(messages), *(c % (len(messages) + 1) for c in cuts)})
    chunks = [messages[a:b] for a, b in itertools.pairwise(points)]
    table = _typed(lo, hi, chunks, batch_rows=batch_rows)
    assert all(len(batch) <= batch_rows for batch in table.column("_op").chunks)
    got = [(r["_op"], None if r["id"] is None else str(r["id"]),
            None if r["amount"] is None else f"{r['amount']:.2f}", r["note"], r["_lsn"],
            r["_seq"], r["_commit_lsn"], r["_txid"], r["_unavailable"])
           for r in table.to_pylist()]
    assert got == _reference(messages, lo, hi)


def test_an_unchanged_wide_key_under_replica_identity_full_is_not_a_key_change() -> None:
    # REPLICA IDENTITY FULL sends the whole old row; a key value stored out of line and
    # left as it was comes as unchanged TOAST in the new row. The key did not change: one
    # update, with the key (and every unsent value) taken from the old row.
    rel = [(1, encode_message(REL))]
    t1 = _txn(1000, 7, Update(None, REL.relation_id, "O", ("1", "12.30", "x"),
                              (UNAVAILABLE, "13.00", UNAVAILABLE)))
    table = _typed(1000, 2000, [rel + t1])
    assert table.column("_op").to_pylist() == ["u"]
    assert table.column("id").to_pylist() == [1]
    assert table.column("amount").to_pylist() == [Decimal("13.00")]
    assert table.column("note").to_pylist() == ["x"]
