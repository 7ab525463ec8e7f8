"""Row changes -> Arrow record batches in the shape of the stream's Spark schema.

Two shapes (the column contract ``apply_changes`` consumes — keep names and types):

**Typed table** (one captured table): the table's own columns with their Spark types
(:mod:`tidemark.spark.type_mapping`), then

=================  ==============  ====================================================
``_op``            string          ``c`` insert, ``u`` update, ``d`` delete, ``t`` truncate
``_lsn``           bigint          LSN of the change
``_commit_lsn``    bigint          commit LSN of its transaction (the batch assignment)
``_seq``           bigint          1-based order of the row in its transaction
``_commit_ts``     timestamp       commit time of the transaction
``_txid``          bigint          PostgreSQL transaction id
``_unavailable``   array<string>   columns whose value is an unchanged TOASTed value the
                                   server did not send, or that the table gained after
                                   the change (an insert or update made before
                                   ``ADD COLUMN``): null there means "unchanged",
                                   not NULL. Empty (never null) when there are none.
=================  ==============  ====================================================

For ``d`` the columns hold the old row as the server sent it (at least the key); for
``t`` all table columns are null.

**Envelope** (many tables in one stream), in one of two row formats:

* ``json`` (the default): ``table`` (``schema.table``), the same ``_op`` … ``_txid``,
  then ``key``, ``before``, ``after`` as JSON objects of column name -> PostgreSQL's
  text of the value (or null), and ``_unavailable``. An unavailable column is absent
  from ``after``. Readable by anything; costs a JSON encoding per row here and a parse
  per row in :func:`tidemark.spark.table_changes`.
* ``struct``: ``table``, ``_op`` … ``_txid``, then **one struct column per captured
  table**, named ``schema.table``, holding the row in that table's typed shape (its own
  columns and types; null in the rows of other tables), and ``_unavailable``. No text
  round trip: :func:`tidemark.spark.table_changes` just selects the struct's fields.
  Each Arrow batch holds rows of one table, so the other tables' columns cost nothing.

* ``arrow``: ``table``, ``rows``, ``data``: each Spark row carries a whole Arrow IPC
  stream (zstd-compressed) of up to ``arrowBatchRows`` rows of one table in its typed shape. For
  consumers that collect each micro-batch to the driver (``tidemark run``): Spark moves
  a few large binary values instead of converting every row to its row format and
  back, which was most of Spark's CPU time per change. Unpack with
  :func:`typed_rows`.

Rows of one table keep commit order (commit LSN, then ``_seq``) within an Arrow batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidemark.change_rows import CHANGE_FIELDS
from tidemark.errors import TerminalError
from tidemark.spark import column_history

#: Spark's types of the contract's Arrow types (:mod:`tidemark.change_rows`).
_SPARK_OF_ARROW: Final = {
    pa.string(): StringType(), pa.int64(): LongType(),
    pa.timestamp("us", tz="UTC"): TimestampType(),
    pa.list_(pa.string()): ArrayType(StringType(), False),
}
#: The change columns every typed table gets after its own columns: the contract's,
#: all filled (non-null) by the Spark source.
META_FIELDS: Final = tuple(StructField(f.name, _SPARK_OF_ARROW[f.type], False)
                           for f in CHANGE_FIELDS)
META_NAMES: Final = frozenset(f.name for f in META_FIELDS)

#: The envelope stream's schema.
ENVELOPE_SCHEMA: Final = StructType([
    StructField("table", StringType(), False),
    *META_FIELDS[:6],
    StructField("key", StringType(), True),
    StructField("before", StringType(), True),
    StructField("after", StringType(), True),
    META_FIELDS[6],
])


#: Metadata key on the envelope's ``after`` (``json``) or ``table`` (``struct``) field:
#: table name -> typed schema (JSON).
TABLE_SCHEMAS_KEY: Final = "tidemark.table_schemas"


def envelope_table_schemas(schema: StructType, *,
                           layouts: bool = False) -> dict[str, StructType]:
    """The typed schemas an envelope stream's schema carries, by ``schema.table``; with
    *layouts*, as the source's sinks need them (the column layouts the query read at
    start, which must not reach a target's schema)."""
    for carrier in ("after", "table"):
        if carrier in schema.fieldNames():
            raw = (schema[carrier].metadata or {}).get(TABLE_SCHEMAS_KEY)
            if isinstance(raw, dict):
                schemas = {name: StructType.fromJson(json.loads(text))
                           for name, text in raw.items()}
                return schemas if layouts else {
                    name: column_history.without_layout(s) for name, s in schemas.items()}
    raise ValueError("not a tidemark envelope stream (it carries no table schemas): use "
                     "tidemark.spark.read_changes")


def is_struct_envelope(schema: StructType) -> bool:
    """True for an envelope of the ``struct`` row format."""
    return "after" not in schema.fieldNames() and not is_packed_envelope(schema.fieldNames())


def is_packed_envelope(names: Sequence[str]) -> bool:
    """True for the column names of an envelope of the ``arrow`` row format."""
    return list(names) == [f.name for f in PACKED_SCHEMA.fields]


#: The envelope schema of the ``arrow`` row format.
PACKED_SCHEMA: Final = StructType([
    StructField("table", StringType(), False),
    StructField("rows", LongType(), False),
    StructField("data", BinaryType(), False),
])


def _unpacked(envelope: pa.Table, table: str, schema: StructType | None) -> pa.Table:
    mine = envelope.filter(pc.equal(envelope.column("table"), table))
    batches: list[pa.RecordBatch] = []
    for blob in mine.column("data").chunks:
        for i in range(len(blob)):
            # Zero copy: the batches keep referencing the collected buffer.
            with pa.ipc.open_stream(blob[i].as_buffer()) as stream:
                batches.extend(stream)
    if batches:
        return pa.Table.from_batches(batches)
    if schema is None:
        raise ValueError(f"no rows of {table}: pass its typed schema to type the empty table")
    return arrow_schema(schema).empty_table()


def typed_rows(envelope: pa.Table, table: str, schema: StructType | None = None) -> pa.Table:
    """The rows of *table* (``schema.table``) of a collected ``struct`` or ``arrow``
    envelope, in the table's typed shape (what :func:`tidemark.spark.table_changes`
    gives in Spark). An ``arrow`` envelope needs the table's typed *schema* (from
    :func:`envelope_table_schemas`) to type an empty result."""
    if is_packed_envelope(envelope.column_names):
        return _unpacked(envelope, table, schema)
    if table not in envelope.column_names:
        raise ValueError(f"table {table} is not in this envelope")
    rows = envelope.filter(pc.equal(envelope.column("table"), table))
    struct = rows.column(table).combine_chunks()
    fields = list(struct.type) if rows.num_rows else list(envelope.schema.field(table).type)
    columns = struct.flatten() if rows.num_rows else [pa.array([], f.type) for f in fields]
    names = [f.name for f in fields] + [f.name for f in META_FIELDS]
    return pa.Table.from_arrays([*columns, *(rows.column(f.name) for f in META_FIELDS)],
                                names=names)


def struct_envelope_schema(tables: dict[str, StructType]) -> StructType:
    """The envelope schema of the ``struct`` row format for typed *tables* (by
    ``schema.table``, each a :func:`typed_schema`)."""
    structs = [StructField(name, StructType([f for f in schema.fields
                                             if f.name not in META_NAMES]), True)
               for name, schema in tables.items()]
    return StructType([ENVELOPE_SCHEMA["table"], *META_FIELDS[:6], *structs, META_FIELDS[6]])


class SchemaChangedError(TerminalError):
    """A table's columns changed after the query fixed its schema."""


def typed_schema(columns: Sequence[StructField]) -> StructType:
    """A typed table's schema: its columns (all nullable: deletes carry only the key,
    truncates nothing) followed by :data:`META_FIELDS`."""
    clash = [c.name for c in columns if c.name in META_NAMES]
    if clash:
        raise SchemaChangedError(f"column(s) {clash} clash with tidemark's change columns")
    return StructType([StructField(c.name, c.dataType, True, c.metadata) for c in columns]
                      + list(META_FIELDS))


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema pyspark requires batches of *schema* to have, exactly (but for
    the column layout the query read at start, which must not reach a target's schema:
    :func:`tidemark.spark.column_history.without_layout`)."""
    return to_arrow_schema(column_history.without_layout(schema), timezone="UTC")
