"""What a crash would redeliver, measured at every consumer call: the records processed
beyond the last saved offset. docs/configuration.md promises at most ``max_in_flight``
of them with ``offset_flush_interval_ms = 0``, in every delivery mode; the SIGKILL tests
(test_engine_crash.py) check the same bound at one random moment each, this one at all.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tidemark.engine.converters import EventConverter
from tidemark.engine.engine import Engine
from tidemark.event import ChangeEvent
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.offsets.store import Offset
from tidemark.source.synthetic import SyntheticConnector

MODES = ["batch", "ordered", "async", "per_key"]
IN_FLIGHT = 450
TOTAL = 20_000


class _Watch(MemoryOffsetStore):
    """A memory store that follows what a crash at any moment would redeliver."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.saved = 0  # records before the saved position (synthetic: its number)
        self.processed = 0
        self.worst = 0

    def save(self, key: str, offset: Offset) -> None:
        super().save(key, offset)
        with self.lock:
            self.saved = int(offset["position"])

    def processed_one(self, n: int = 1) -> None:
        with self.lock:
            self.processed += n
            self.worst = max(self.worst, self.processed - self.saved)


@pytest.mark.parametrize("mode", MODES)
def test_records_processed_beyond_the_saved_offset_stay_within_max_in_flight(
        mode: str) -> None:
    store = _Watch()

    def consume(record: Any) -> None:
        store.processed_one()
        event = record.value
        # A stall at the end of every tenth batch: the other workers finish what is
        # in flight behind it, the worst case for what a crash redelivers.
        if isinstance(event, ChangeEvent) and (event.lsn + 1) % 1_000 == 0:
            time.sleep(0.02)

    class Batches:
        def handle_batch(self, records: list[Any], committer: Any) -> None:
            for record in records:
                consume(record)

    engine = Engine(SyntheticConnector(total=TOTAL, batch_size=100),
                    Batches() if mode == "batch" else consume,
                    config={"delivery_mode": mode, "worker_count": 4,
                            "offset_flush_interval_ms": 0, "max_in_flight": IN_FLIGHT},
                    converter=EventConverter(), offset_store=store)
    engine.run()
    assert store.processed == TOTAL
    assert store.worst <= IN_FLIGHT, \
        f"{mode}: a crash could have redelivered {store.worst} records, more than " \
        f"max_in_flight={IN_FLIGHT}"
