"""What the engine delivers records to: the consumer and processor interfaces."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Protocol, runtime_checkable

from tidemark.engine.converters import ConvertedRecord
from tidemark.event import Record
from tidemark.serde.json_lines import JsonLines


class BatchCommitter(Protocol):
    """Given to :meth:`ChangeConsumer.handle_batch` with each batch."""

    def mark_batch_finished(self) -> None:
        """The batch is processed: its offset may be committed now, before
        ``handle_batch`` returns (returning does the same)."""
        ...

    def mark_batch_unfinished(self) -> None:
        """The consumer took only part of the batch and will take no more (it stops:
        its output closed, a limit reached): the batch counts as processed, but neither
        its offset nor a later batch's is committed, so a restart delivers it again."""
        ...


@runtime_checkable
class ChangeConsumer(Protocol):
    """Delivery mode ``batch``: one call per polled batch, after the whole batch has
    been transformed and converted (in parallel, in the worker pool)."""

    def handle_batch(self, records: list[ConvertedRecord], committer: BatchCommitter) -> None:
        ...


@runtime_checkable
class JsonLinesConsumer(Protocol):
    """Delivery mode ``batch``, for a consumer that writes Debezium JSON lines (the
    engine's converter is then a :class:`~tidemark.engine.converters.DebeziumJsonConverter`):
    one call per polled batch with its lines ready to write. Without transforms, a
    source that can write the lines itself (the PostgreSQL task) hands them over and
    they reach the consumer unchanged, which is the fastest way through the engine."""

    def handle_lines(self, lines: JsonLines, committer: BatchCommitter) -> None:
        ...


#: Delivery modes ``ordered``, ``async`` and ``per_key``: one call per record.
RecordConsumer = Callable[[ConvertedRecord], None]


class ProcessorContext(Protocol):
    """What a :class:`RecordProcessor` may use."""

    @property
    def executor(self) -> Executor:
        """The engine's worker pool."""
        ...

    def convert(self, records: Sequence[Record]) -> list[ConvertedRecord]:
        """Run the engine's transforms and converter over *records* (in parallel)."""
        ...


@runtime_checkable
class RecordProcessor(Protocol):
    """Full control of processing (advanced use): the engine hands over each polled
    batch untransformed; when :meth:`process` returns, the batch counts as processed
    and its offset may be committed. Batches come one at a time, in source order."""

    def process(self, records: list[Record], context: ProcessorContext) -> None:
        ...
