"""A JSON-lines consumer on the engine (what ``tidemark capture`` runs on), and the
offset flush interval of batch delivery (fast; no database)."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

from tidemark.engine.avro_converter import AvroConverter
from tidemark.engine.converters import ConvertedRecord, DebeziumJsonConverter
from tidemark.engine.engine import Engine
from tidemark.engine.transforms import Filter
from tidemark.errors import ConfigError
from tidemark.event import ChangeEvent, Op, TransactionBoundary
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.offsets.store import Offset
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.serde.json_lines import JsonLines, lines_of_converted, lines_of_events
from tidemark.source.synthetic import SyntheticConnector
from tidemark.testing.sink import MemorySink


class LinesSink:
    """Collects the lines handed to it (a JsonLinesConsumer)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.changes = 0
        self.batches = 0
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def handle_lines(self, lines: JsonLines, committer: Any) -> None:
        with self._lock:
            self.texts += lines.texts
            self.changes += lines.changes
            self.batches += 1
            self.threads.add(threading.current_thread().name)


class CountingStore(MemoryOffsetStore):
    """Counts saves."""

    def __init__(self) -> None:
        super().__init__()
        self.saves = 0

    def save(self, partition: str, offset: Offset) -> None:
        self.saves += 1
        super().save(partition, offset)


def _lines_of(records: list[ConvertedRecord]) -> list[str]:
    return [f'{{"key":{r.key or "null"},"value":{r.value or "null"}}}\n' for r in records]


def _timeless(text: str) -> str:
    """*text* without its timestamps (two runs of the synthetic source differ there)."""
    return re.sub(r'"ts_(ms|us|ns)":\d+', "", text)


def test_a_lines_consumer_gets_what_a_batch_consumer_gets_as_lines() -> None:
    lines, records = LinesSink(), MemorySink()
    store = MemoryOffsetStore()
    connector = SyntheticConnector(total=3_000, batch_size=250)
    Engine(connector, lines, config={"delivery_mode": "batch"}, offset_store=store).run()
    Engine(SyntheticConnector(total=3_000, batch_size=250), records,
           config={"delivery_mode": "batch"}).run()
    assert _timeless("".join(lines.texts)) == _timeless("".join(_lines_of(records.records)))
    assert lines.changes == 3_000 and lines.batches == 12
    assert store.load(connector.created[0].partition) == {"position": 3_000}


def test_a_lines_consumer_after_transforms_gets_the_converted_records_as_lines() -> None:
    keep = Filter(lambda event: event.op is not Op.DELETE)
    lines, records = LinesSink(), MemorySink()
    Engine(SyntheticConnector(total=2_000, batch_size=100), lines,
           config={"delivery_mode": "batch"}, transforms=[keep]).run()
    Engine(SyntheticConnector(total=2_000, batch_size=100), records,
           config={"delivery_mode": "batch"}, transforms=[keep]).run()
    assert _timeless("".join(lines.texts)) == _timeless("".join(_lines_of(records.records)))


def test_without_read_ahead_a_single_consumer_runs_in_the_readers_thread() -> None:
    sink = LinesSink()
    Engine(SyntheticConnector(total=2_000, batch_size=100), sink,
           config={"delivery_mode": "batch", "read_ahead": False}).run()
    assert sink.threads == {"tidemark-task0"} and sink.changes == 2_000


def test_consumers_of_records_and_of_lines_do_not_mix() -> None:
    with pytest.raises(ConfigError, match="not both"):
        Engine(SyntheticConnector(), [LinesSink(), MemorySink()],
               config={"delivery_mode": "batch"})


def test_a_lines_consumer_refuses_a_converter_that_writes_no_json() -> None:
    with pytest.raises(ConfigError, match="AvroConverter does not write them"):
        Engine(SyntheticConnector(), LinesSink(), converter=AvroConverter(),
               config={"delivery_mode": "batch"})


@pytest.mark.parametrize(("interval_ms", "at_most"), [(60_000, 2), (0, None)])
def test_batch_delivery_saves_offsets_at_the_flush_interval(interval_ms: int,
                                                             at_most: int | None) -> None:
    """A finished batch does not force a save: with a long interval the first offset
    is saved at once and the next only at the end; with 0 after every batch (the
    consumers run in the reader's thread here, so each batch is done before the
    reader's next flush)."""
    for consumer in (LinesSink(), MemorySink()):
        store = CountingStore()
        connector = SyntheticConnector(total=5_000, batch_size=100)
        Engine(connector, consumer, config={"delivery_mode": "batch", "read_ahead": False,
                                            "offset_flush_interval_ms": interval_ms},
               offset_store=store).run()
        assert store.load(connector.created[0].partition) == {"position": 5_000}
        assert consumer.batches == 50
        if at_most is not None:
            assert store.saves <= at_most
        else:
            assert store.saves >= 50


def test_first_changes_cuts_before_the_change_after_n() -> None:
    plain = JsonLines(["a\n", "b\n", "c\n"])
    assert plain.first_changes(3) is None
    assert plain.first_changes(1) == JsonLines(["a\n"])
    framed = JsonLines(["B\n", "a\n", "b\n", "E\n", "B\n", "c\n"], (0, 3, 4))
    assert framed.changes == 3
    assert framed.first_changes(2) == JsonLines(["B\n", "a\n", "b\n", "E\n", "B\n"],
                                                (0, 3, 4))
    assert framed.first_changes(0) == JsonLines(["B\n"], (0,))


def test_lines_of_converted_keeps_tombstones_with_their_change_and_marks_boundaries() -> None:
    event: Any = object()
    boundary = TransactionBoundary("BEGIN", "1", 0, 0)
    records = [ConvertedRecord("t", '{"id":"1"}', '{"status":"BEGIN"}', boundary),
               ConvertedRecord("t", '{"k":1}', '{"op":"d"}', event),
               ConvertedRecord("t", '{"k":1}', None, event),
               ConvertedRecord("t", None, '{"op":"c"}', event)]
    lines = lines_of_converted(records)
    assert lines.texts == ['{"key":{"id":"1"},"value":{"status":"BEGIN"}}\n',
                           '{"key":{"k":1},"value":{"op":"d"}}\n{"key":{"k":1},"value":null}\n',
                           '{"key":null,"value":{"op":"c"}}\n']
    assert lines.non_changes == (0,) and lines.changes == 2


def test_lines_of_events_is_the_serializers_lines_and_the_converters() -> None:
    events: list[Any] = []

    class Keep:
        def handle_batch(self, records: list[ConvertedRecord], committer: Any) -> None:
            for record in records:  # a delete's tombstone has the delete's event
                if not events or events[-1] is not record.event:
                    events.append(record.event)

    Engine(SyntheticConnector(total=300, batch_size=300), Keep(),
           config={"delivery_mode": "batch"}).run()
    assert all(isinstance(e, ChangeEvent) for e in events)
    options = DebeziumJsonOptions()
    lines = lines_of_events(DebeziumJsonSerializer(options), events)
    assert lines.texts == DebeziumJsonSerializer(options).text_lines(events)
    assert DebeziumJsonConverter(options).lines(events) == lines
