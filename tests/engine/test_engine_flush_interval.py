"""Every delivery mode saves offsets at most every ``offset_flush_interval_ms`` (the
first at once, the last on close), counted over a real store."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tidemark.engine.engine import Engine
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.offsets.store import Offset
from tidemark.source.synthetic import SyntheticConnector
from waiting import wait_for

MODES = ["batch", "ordered", "async", "per_key"]
INTERVAL_MS = 250


class _CountingStore(MemoryOffsetStore):
    def __init__(self) -> None:
        super().__init__()
        self.saves: list[float] = []

    def save(self, key: str, offset: Offset) -> None:
        self.saves.append(time.monotonic())
        super().save(key, offset)


@pytest.mark.parametrize("mode", MODES)
def test_offsets_are_saved_at_the_flush_interval_and_once_more_on_close(mode: str) -> None:
    store = _CountingStore()
    batches = [0]

    def consume(record: Any) -> None:
        return None

    class Batches:
        def handle_batch(self, records: list[Any], committer: Any) -> None:
            batches[0] += 1

    connector = SyntheticConnector(total=None, batch_size=100)
    engine = Engine(connector, Batches() if mode == "batch" else consume,
                    config={"delivery_mode": mode, "worker_count": 2,
                            "offset_flush_interval_ms": INTERVAL_MS},
                    offset_store=store)
    runner = threading.Thread(target=engine.run)
    started = time.monotonic()
    runner.start()
    def saved_a_few() -> bool:  # a few intervals' worth of saves
        assert runner.is_alive(), "the engine stopped before saving offsets"
        return len(store.saves) >= 4

    wait_for(saved_a_few, 30, "offsets being saved", interval_s=0.01)
    engine.close()
    runner.join(30)
    elapsed = time.monotonic() - started
    # The first save at once, then one per interval at most, and the last on close.
    assert len(store.saves) <= 2 + elapsed * 1000 / INTERVAL_MS, \
        f"{mode}: {len(store.saves)} saves in {elapsed:.2f}s at {INTERVAL_MS} ms"
    gaps = [b - a for a, b in zip(store.saves[:-1], store.saves[1:-1], strict=False)]
    assert all(gap >= INTERVAL_MS / 1000 * 0.99 for gap in gaps), (mode, gaps)
    # The last save, on close, holds the offset of what was processed.
    last = store.load(connector.created[0].partition)
    assert last is not None and last["position"] > 0
    if mode == "batch":
        assert batches[0] > len(store.saves), "too few batches to tell"
