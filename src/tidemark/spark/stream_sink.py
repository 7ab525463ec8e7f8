"""What every source's Spark reader shares: the sink that turns its changes into the
stream's record batches, and decoding without the cyclic garbage collector."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from pyspark.sql.types import StructType

from tidemark.spark.arrow_rows import (
    EnvelopeSink,
    PackedEnvelopeSink,
    StructEnvelopeSink,
    TypedSink,
)
from tidemark.spark.change_schemas import envelope_table_schemas
from tidemark.spark.options import RowFormat, SourceOptions

Sink = TypedSink | StructEnvelopeSink | EnvelopeSink


def stream_sink(options: SourceOptions, schema: StructType) -> Sink:
    """The sink that builds *schema*'s record batches (typed, struct, packed or JSON)."""
    if options.table is not None:
        return TypedSink(options.table, schema, options.arrow_batch_rows,
                         options.on_schema_change, options.arrow_batch_bytes)
    if options.row_format is not RowFormat.JSON:
        kind = StructEnvelopeSink if options.row_format is RowFormat.STRUCT else \
            PackedEnvelopeSink
        return kind(schema, envelope_table_schemas(schema, layouts=True), options.arrow_batch_rows,
                    options.on_schema_change, options.arrow_batch_bytes)
    return EnvelopeSink(options.tables, options.arrow_batch_rows, options.arrow_batch_bytes,
                        schema)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while decoding.

    Decoding allocates millions of short-lived, acyclic objects (freed by reference
    counting); in a Spark Python worker, whose heap holds pyspark, pandas and pyarrow,
    each full collection walks all of it. Pausing the collector cut decode time by a
    quarter to a third in measurements here.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
