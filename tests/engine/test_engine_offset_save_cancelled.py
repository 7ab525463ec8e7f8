"""An offset save that fails until the engine stops (the store is down, the retry is
cancelled by close()): the offset stays to be saved, and close() saves it once the
store is back; records are released only once their offset is saved."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from tidemark.engine.engine import Engine
from tidemark.errors import SourceUnavailableError
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.offsets.store import Offset
from tidemark.source.synthetic import SyntheticConnector
from waiting import wait_for


class _FlakyStore:
    """A real in-memory store whose saves fail while :attr:`down` is set."""

    def __init__(self) -> None:
        self.inner = MemoryOffsetStore()
        self.down = threading.Event()
        self.refused: list[Offset] = []

    def load(self, key: str) -> Offset | None:
        return self.inner.load(key)

    def load_many(self, keys: Sequence[str]) -> dict[str, Offset]:
        return self.inner.load_many(keys)

    def save(self, key: str, offset: Offset) -> None:
        if self.down.is_set():
            self.refused.append(offset)
            raise SourceUnavailableError("the offset store is down (test)")
        self.inner.save(key, offset)

    def save_many(self, offsets: Mapping[str, Offset]) -> None:
        for key, offset in offsets.items():
            self.save(key, offset)


@pytest.mark.parametrize("flush_interval_ms", [0, 1000], ids=["until-saved", "interval"])
def test_an_offset_whose_save_was_cancelled_is_saved_at_close(
        flush_interval_ms: int, caplog: pytest.LogCaptureFixture) -> None:
    store = _FlakyStore()

    class Batches:
        def handle_batch(self, records: list[Any], committer: Any) -> None:
            pass

    connector = SyntheticConnector(total=None, batch_size=10)
    engine = Engine(connector, Batches(), offset_store=store, config={
        "delivery_mode": "batch", "offset_flush_interval_ms": flush_interval_ms,
        "max_in_flight": 50, "errors_max_retries": -1,
        # The retry is still waiting when close() comes: the save is cancelled.
        "errors_retry_delay_initial_ms": 10_000, "errors_retry_delay_max_ms": 10_000})
    caplog.set_level(logging.WARNING, logger="tidemark.engine.task_runner")
    runner = threading.Thread(target=engine.run)
    runner.start()
    try:
        wait_for(lambda: store.inner.load("synthetic/synthetic/0"), 30, "a first save")
        store.down.set()
        wait_for(lambda: "offset save failed" in caplog.text, 30, "a failed save")
        refused = store.refused[0]
        store.down.clear()  # back, but the engine's retry is not due for 10 s
        engine.close()
    finally:
        store.down.clear()
        runner.join(30)
    saved = store.inner.load("synthetic/synthetic/0")
    assert saved is not None
    # The offset whose save was cancelled (or a later one) is saved: nothing the
    # consumer was done with is left to be redelivered beyond what close() drained.
    assert int(saved["position"]) >= int(refused["position"]), (saved, refused)
