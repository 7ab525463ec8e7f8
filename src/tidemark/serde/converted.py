"""What a converter hands a consumer: the record types of the engine's output.

They live below the engine because a source may make them itself: the PostgreSQL task's
fused path writes :class:`RenderedRecord` s and :class:`ConvertedBatch` es directly when
the engine has no transforms (see :mod:`tidemark.engine.prerender`), and a source may
not import the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from tidemark.event import Record, TableId


class ConvertedRecord(msgspec.Struct, gc=False):
    """What a consumer receives: ``key`` and ``value`` in the converter's format (None
    for a tombstone's value or a keyless table's key), and the event they came from
    (after the transforms)."""

    destination: str
    key: Any
    value: Any
    event: Record


_EVENT: Final[Any] = ConvertedRecord.__dict__["event"]


class RenderedRecord(ConvertedRecord, gc=False):
    """A :class:`ConvertedRecord` that a source made directly, as
    :class:`~tidemark.engine.converters.DebeziumJsonConverter` would make it of a
    :class:`~tidemark.serde.rendered.RenderedEvent` (the PostgreSQL task's fused path,
    when the engine has no transforms): one object per change instead of an event and
    a record, and no pass of the converter over it.

    Its ``event`` is made on first access, by ``make_event`` (which the source shares
    between the records of one table, operation and transaction) from the fields here
    that differ per change; or given at once, for a delete and its tombstone, which
    share one event as the converter's records of it do (``make_event`` is then None
    and the fields after it unused).
    """

    make_event: Callable[[RenderedRecord], Record] | None = None
    lsn: int = 0
    total_order: int = 0
    collection_order: int = 0
    wire: bytes = b""

    @property  # type: ignore[misc]  # a lazy field
    def event(self) -> Record:
        event: Record | None = _EVENT.__get__(self)
        if event is None:
            assert self.make_event is not None
            event = self.make_event(self)
            _EVENT.__set__(self, event)  # memoized; racing threads store equal events
        return event

    @event.setter
    def event(self, event: Record) -> None:
        _EVENT.__set__(self, event)

    def __reduce__(self) -> tuple[Any, ...]:
        # make_event is a closure: pickled, this is the plain record it stands for.
        return ConvertedRecord, (self.destination, self.key, self.value, self.event)


class ConvertedBatch(list[ConvertedRecord]):
    """A source's batch in which every record is already what
    :class:`~tidemark.engine.converters.DebeziumJsonConverter` would make (the
    PostgreSQL task's fused path, when every change of the batch took it): the converter
    hands it on without a pass over its records."""

    __slots__ = ()


def table_destination(prefix: str, table: TableId) -> str:
    """Debezium's topic name for the changes of *table* (``<prefix>.<schema>.<table>``)."""
    return f"{prefix}.{table.schema}.{table.table}"
