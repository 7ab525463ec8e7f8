"""The connector SPI: what a source must provide to run on the engine.

A :class:`SourceConnector` turns its configuration into up to ``tasks_max`` task
configurations (the PostgreSQL connector: one per database); each becomes a
:class:`SourceTask`, which the engine runs in a worker of its own. A task polls batches
of records with the offset to resume from after them; the engine calls
:meth:`SourceTask.commit` with an offset only once every record up to it has been
processed by the consumer and the offset has been saved.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from tidemark.offsets.store import Offset, OffsetReader, OffsetStore
from tidemark.serde.debezium_json import DebeziumJsonOptions
from tidemark.serde.modes import TimePrecisionMode
from tidemark.source.batch import SourceBatch

TaskConfig = Mapping[str, Any]


class SourceTask(Protocol):
    """One independently running part of a capture (one database, one stream group).

    ``start`` and ``poll`` may raise :class:`tidemark.errors.TransientError` for failures
    worth retrying: the engine then calls the same method again after a backoff, so a
    task must stay usable after raising one.
    """

    @property
    def partition(self) -> str:
        """The offset key of this task (valid once started)."""
        ...

    def start(self, offsets: OffsetReader) -> None:
        """Connect and position the task at its saved offset (looked up in *offsets*)."""
        ...

    def poll(self) -> SourceBatch:
        """The next batch; may be empty when the source is idle, and should return within
        about a second so that the engine can notice a stop request."""
        ...

    def commit(self, offset: Offset) -> None:
        """*offset* is saved and everything before it processed: the source may release
        what it holds up to there (a replication slot confirms the LSN)."""
        ...

    def stop(self) -> None:
        """Release connections and resources; called once, also after a failed start."""
        ...


@runtime_checkable
class RendersDebeziumJson(Protocol):
    """Optional for a task: it can emit row changes with their Debezium JSON already
    written (:class:`~tidemark.serde.rendered.RenderedEvent`), cheaper than the
    converter serializing the events. The engine asks, before ``start``, when its
    pipeline would pass such texts through unchanged."""

    def render_debezium_json(self, options: DebeziumJsonOptions, *,
                             converted_records: bool = False, lines: bool = False) -> bool:
        """Render in *options* from now on; False if the task declines. With
        *converted_records* (the engine has no transforms, and its converter passes
        them on) the task may also emit
        :class:`~tidemark.serde.converted.RenderedRecord` s, the converter's output
        itself. With *lines* (the engine's consumer writes JSON lines, and nothing
        transforms the events) the task may instead hand over what it renders as
        JSON lines (:attr:`~tidemark.source.batch.SourceBatch.lines`, a batch holding
        lines or records, never both)."""
        ...


class SourceConnector(Protocol):
    """A configured source that splits its work into tasks.

    Optional: a ``cells_by_default`` attribute, True when the source's events are
    written as ScyllaDB's cells unless the converter's options say otherwise
    (:func:`cells_by_default`)."""

    @property
    def name(self) -> str:
        """A short name for logs and errors."""
        ...

    def task_configs(self, tasks_max: int) -> list[TaskConfig]:
        """Up to *tasks_max* task configurations (raise ConfigError if the work cannot be
        split that few ways)."""
        ...

    def create_task(self, config: TaskConfig) -> SourceTask:
        """A new, not yet started task for one of :meth:`task_configs`' entries."""
        ...


def source_time_precision_mode(connector: SourceConnector) -> TimePrecisionMode | None:
    """The time precision mode *connector*'s settings chose (its optional
    ``time_precision_mode`` attribute: MariaDB's ``adaptive_time_microseconds`` unless
    set, as Debezium's binlog connectors), which a converter left at its default follows;
    None when the source has no such setting."""
    mode = getattr(connector, "time_precision_mode", None)
    return mode if isinstance(mode, TimePrecisionMode) else None


def cells_by_default(connector: SourceConnector) -> bool:
    """Whether *connector*'s events are written as cells when the converter's options
    leave it to the source (``DebeziumJsonOptions.cells`` None): its optional
    ``cells_by_default`` attribute — True for log tables, whose updates leave the
    columns they did not set unavailable, which plain values cannot tell from NULL in
    every type — else False."""
    return getattr(connector, "cells_by_default", False) is True


@runtime_checkable
class SavesOffsetsByKey(Protocol):
    """Optional for a task with many offset keys (a log-table task: one per stream
    group): its batch offset is split into keys to store, and told when they are."""

    def offsets_by_key(self, offset: Offset) -> dict[str, Offset]:
        """The stored offsets that *offset* stands for (only those that changed)."""
        ...

    def saved(self, offset: Offset) -> None:
        """*offset*'s keys are durably stored."""
        ...


def save_offset(store: OffsetStore, task: Any, offset: Offset) -> None:
    """Durably store a task's committable *offset*: under its ``partition``, or, for a
    task with many keys, as one :meth:`OffsetStore.save_many` of the keys that moved."""
    if isinstance(task, SavesOffsetsByKey):
        by_key = task.offsets_by_key(offset)
        save_many = getattr(store, "save_many", None)
        if callable(save_many):
            if by_key:
                save_many(by_key)
        else:  # a store of the protocol before save_many
            for key, value in by_key.items():
                store.save(key, value)
        task.saved(offset)
    else:
        store.save(task.partition, offset)
