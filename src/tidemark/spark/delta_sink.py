"""``format("tidemark-delta")``: a streaming sink that applies change rows to a Delta table.

What a Spark Declarative Pipeline uses where ``create_auto_cdc_flow`` needs a MERGE-capable
table format that a plain pyspark does not have: :func:`tidemark.spark.cdc_flow.
create_delta_cdc_flow` declares this sink and the flow into it, with
``create_auto_cdc_flow``'s parameters. It works for any streaming query too
(``writeStream.format("tidemark-delta").option("path", …).option("keys", "id")``).

Each micro-batch: the executors write their rows to Arrow files in a staging directory
beside the table (:class:`DeltaChangesWriter.write`), and the driver applies them, in
partition order and in steps of ``stepRows`` rows or ``stepBytes`` bytes (reading each
staged file a record batch at a time, so a batch of any size fits the driver), as
**one** Delta commit carrying the
app transaction ``(appId, batch id)`` (:func:`tidemark.lake.apply_changes_in_steps`): a
replayed batch is skipped, so the table takes every batch exactly once. The staged
files are removed once applied, or when Spark aborts the batch.

Options (strings; lists comma-separated): ``path`` (the Delta table, required), ``keys``
(required), ``sequenceBy`` (default: tidemark's ``_commit_lsn,_seq``), ``deletesColumn``
and ``truncatesColumn`` (boolean columns marking deletes and truncates; default:
tidemark's ``_op``), ``columnList``, ``exceptColumnList``, ``storedAsScdType``,
``trackHistoryColumnList``, ``trackHistoryExceptColumnList``, ``orderedBatches`` (default:
true with tidemark's sequence, false otherwise), ``appId`` (default: from ``path``),
``stagingPath`` (default ``_<table dir>_tidemark_staging`` beside a local table), ``stepRows``
(default 500000), ``stepBytes`` (default 64 MiB), and
``storage.<name>`` for each of delta-rs' storage options.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from tidemark.errors import ConfigError
from tidemark.lake import change_rows as cr
from tidemark.lake.delta_writer import apply_changes_in_steps
from tidemark.lake.spec import DEFAULT_DELETES, DEFAULT_TRUNCATES, ApplySpec
from tidemark.spark import arrow_pieces, column_history

log = logging.getLogger(__name__)

NAME: Final = "tidemark-delta"
_STAGING: Final = "_tidemark_staging"
#: Options Spark sets on every streaming sink (lower case).
_SPARKS: Final = frozenset({"queryname", "checkpointlocation"})
_OPTIONS: Final = ("path", "keys", "sequenceBy", "deletesColumn", "truncatesColumn",
                   "columnList", "exceptColumnList", "storedAsScdType",
                   "trackHistoryColumnList", "trackHistoryExceptColumnList",
                   "orderedBatches", "appId", "stagingPath", "stepRows", "stepBytes")


@dataclasses.dataclass(frozen=True)
class SinkOptions:
    """The sink's options, validated."""

    path: str
    spec: ApplySpec
    app_id: str
    staging: str
    step_rows: int
    step_bytes: int
    storage_options: dict[str, str] | None = dataclasses.field(repr=False)
    """delta-rs' options (``storage.<name>``); left out of ``repr``: credentials."""

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> SinkOptions:
        """Validate *raw* (Spark's case-insensitive option map)."""
        lowered = {k.lower(): k for k in _OPTIONS}
        given: dict[str, str] = {}
        storage: dict[str, str] = {}
        for key, value in raw.items():
            if key.lower().startswith("storage."):
                storage[key[len("storage."):]] = value
            elif key.lower() in lowered:
                given[lowered[key.lower()]] = value
            elif key.lower() not in _SPARKS:
                # Spark's own options are passed to every sink with the user's.
                raise ConfigError(key, f"unknown option of the {NAME} sink; allowed: "
                                       f"{', '.join(_OPTIONS)}, storage.<delta-rs option>")
        for required in ("path", "keys"):
            if not given.get(required):
                raise ConfigError(required, f"required by the {NAME} sink")
        sequence = _names(given.get("sequenceBy")) or cr.DEFAULT_SEQUENCE
        ordered = given.get("orderedBatches", str(sequence == cr.DEFAULT_SEQUENCE)).lower()
        if ordered not in ("true", "false"):
            raise ConfigError("orderedBatches", f"must be true or false, got {ordered!r}")
        settings: dict[str, Any] = {"keys": _names(given["keys"]), "sequence_by": sequence,
                                    "ordered_batches": ordered == "true"}
        for option, field in (("columnList", "column_list"),
                              ("exceptColumnList", "except_column_list"),
                              ("trackHistoryColumnList", "track_history_column_list"),
                              ("trackHistoryExceptColumnList",
                               "track_history_except_column_list")):
            if option in given:
                settings[field] = _names(given[option])
        if "storedAsScdType" in given:
            if given["storedAsScdType"] not in ("1", "2"):
                raise ConfigError("storedAsScdType", "must be 1 or 2")
            settings["stored_as_scd_type"] = int(given["storedAsScdType"])
        for option, field in (("deletesColumn", "apply_as_deletes"),
                              ("truncatesColumn", "apply_as_truncates")):
            if option in given:
                settings[field] = pc.field(given[option])
        path = given["path"]
        step = given.get("stepRows", "500000")
        if not step.isdigit() or int(step) < 1:
            raise ConfigError("stepRows", f"must be a positive integer, got {step!r}")
        step_bytes = given.get("stepBytes", str(arrow_pieces.DEFAULT_STEP_BYTES))
        if not step_bytes.isdigit() or int(step_bytes) < 1:
            raise ConfigError("stepBytes", f"must be a positive integer, got {step_bytes!r}")
        # Beside the table, not in it: before the first batch creates the table, a
        # directory holding other files is not one to create a table in.
        staging = given.get("stagingPath") or (
            "" if "://" in path else
            os.path.join(os.path.dirname(os.path.abspath(path)),
                         f"_{os.path.basename(os.path.abspath(path))}{_STAGING}"))
        if not staging:
            raise ConfigError("stagingPath", f"{path} is not a local path: give a directory "
                                             "the executors and the driver share")
        digest = hashlib.sha256(path.encode()).hexdigest()[:16]
        return cls(path=path, spec=ApplySpec(**settings),
                   app_id=given.get("appId") or f"tidemark-delta-{digest}", staging=staging,
                   step_rows=int(step), step_bytes=int(step_bytes),
                   storage_options=storage or None)


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(n.strip() for n in (text or "").split(",") if n.strip())


@dataclasses.dataclass
class StagedRows(WriterCommitMessage):
    """One partition's rows of a batch, in an Arrow file."""

    partition: int
    path: str | None
    rows: int


class DeltaChangesSink(DataSource):
    """The ``tidemark-delta`` data source (a streaming sink; see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def streamWriter(self, schema: StructType,  # noqa: N802 - pyspark API name
                     overwrite: bool) -> DataSourceStreamWriter:
        return DeltaChangesWriter(SinkOptions.parse(self.options))


class DeltaChangesWriter(DataSourceStreamArrowWriter):
    """Stages each partition's rows on the executors, applies them on the driver."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext  # noqa: PLC0415

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        first = next(iterator, None)
        if first is None:
            return StagedRows(partition, None, 0)
        Path(self.options.staging).mkdir(parents=True, exist_ok=True)
        path = os.path.join(self.options.staging, f"{uuid.uuid4().hex}.arrow")
        rows = 0
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, first.schema) as writer:
            for batch in (first, *iterator):
                writer.write_batch(batch)
                rows += batch.num_rows
        return StagedRows(partition, path, rows)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        staged = sorted((m for m in messages if isinstance(m, StagedRows) and m.path),
                        key=lambda m: m.partition)
        try:
            pieces = arrow_pieces.pieces(_read(staged), self.options.step_rows,
                                         self.options.step_bytes)
            first = next(pieces, None)
            if first is not None:
                result = apply_changes_in_steps(
                    self.options.path, arrow_pieces.first_then(first, pieces),
                    spec_for(self.options.spec, first.schema), app_id=self.options.app_id,
                    version=batchId, storage_options=self.options.storage_options)
                log.info("batch %d into %s: %s", batchId, self.options.path, result)
        finally:
            _remove(staged)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        _remove([m for m in messages if isinstance(m, StagedRows)])


def _read(staged: Sequence[StagedRows]) -> Iterator[pa.Table]:
    """The staged rows, a record batch (as Spark's writer handed it over) at a time: a
    partition's file holds as much of the batch as the partition had."""
    for message in staged:
        assert message.path is not None
        with pa.OSFile(message.path) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                # A typed stream's first column carries the source's layout (see
                # tidemark.spark.column_history); the target's schema must not.
                yield column_history.arrow_without_layout(
                    pa.Table.from_batches([reader.get_batch(i)]))


def _remove(staged: Sequence[StagedRows]) -> None:
    for message in staged:
        if message.path:
            with contextlib.suppress(OSError):
                os.remove(message.path)


def spec_for(spec: ApplySpec, schema: pa.Schema) -> ApplySpec:
    """*spec* for rows of *schema*: without tidemark's ``_op`` column, rows are no
    deletes or truncates unless a column says so (``deletesColumn``, ``truncatesColumn``)."""
    if cr.OP in schema.names:
        return spec
    never = pc.scalar(False)
    return dataclasses.replace(
        spec,
        apply_as_deletes=never if spec.apply_as_deletes.equals(DEFAULT_DELETES)
        else spec.apply_as_deletes,
        apply_as_truncates=never if spec.apply_as_truncates.equals(DEFAULT_TRUNCATES)
        else spec.apply_as_truncates)
