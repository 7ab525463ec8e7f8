"""A batch as Debezium JSON lines: what ``tidemark capture`` writes, ready to write.

A source that writes the lines itself straight from its wire format (the PostgreSQL
reader's ``json_lines``, :attr:`~tidemark.source.batch.SourceBatch.lines`) hands over
one text per change event, which reaches a lines consumer unchanged: no object per
change, no second pass that formats the line. Other batches are made into the same
shape by the serializer (:func:`lines_of_events`) or, after transforms, from the
converter's records (:func:`lines_of_converted`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from tidemark.event import ChangeEvent, Record, TransactionBoundary
from tidemark.serde.converted import ConvertedRecord, RenderedRecord
from tidemark.serde.debezium_json import DebeziumJsonSerializer


class JsonLines(NamedTuple):
    """One batch as newline-terminated Debezium JSON lines ``{"key": …, "value": …}``."""

    texts: list[str]
    """One text per change event: its line (followed by its tombstone's after a
    delete); and one per record that is not a change event (see ``non_changes``)."""
    non_changes: tuple[int, ...] = ()
    """Indexes in ``texts`` of what is not a change event: transaction BEGIN/END
    records, a tombstone with no change before it in the batch."""

    @property
    def changes(self) -> int:
        """Change events in the batch."""
        return len(self.texts) - len(self.non_changes)

    def first_changes(self, n: int) -> JsonLines | None:
        """The batch up to (excluding) the change event after the first *n*; None if
        it has no more than *n* (nothing to cut)."""
        if self.changes <= n:
            return None
        if not self.non_changes:
            return JsonLines(self.texts[:n])
        others = set(self.non_changes)
        seen = 0
        for index in range(len(self.texts)):
            if index not in others:
                seen += 1
                if seen > n:
                    return JsonLines(self.texts[:index],
                                     tuple(i for i in self.non_changes if i < index))
        raise AssertionError("unreachable: fewer changes than counted")


def lines_of_events(serializer: DebeziumJsonSerializer,
                    records: Sequence[Record]) -> JsonLines:
    """*records* (untransformed events) as the serializer's JSON lines."""
    texts = serializer.text_lines(records)
    if not serializer.options.transaction_metadata:
        return JsonLines(texts)  # a text per change event, none for a BEGIN/END
    # One text per record: the BEGIN/END records are where they are in *records*.
    return JsonLines(texts, tuple(i for i, record in enumerate(records)
                                  if not isinstance(record, ChangeEvent)))


def lines_of_converted(records: Sequence[ConvertedRecord]) -> JsonLines:
    """A converter's Debezium JSON records (key and value texts) as JSON lines; a
    tombstone's line goes with the change before it."""
    texts: list[str] = []
    non_changes: list[int] = []
    for record in records:
        key, value = record.key, record.value
        line = f'{{"key":{key or "null"},"value":{value or "null"}}}\n'
        if value is None and texts and (not non_changes or non_changes[-1] != len(texts) - 1):
            texts[-1] += line  # the tombstone of the change before
            continue
        # A RenderedRecord is always a row change (its event is made only when read).
        if value is None or (type(record) is not RenderedRecord
                             and isinstance(record.event, TransactionBoundary)):
            non_changes.append(len(texts))
        texts.append(line)
    return JsonLines(texts, tuple(non_changes))
