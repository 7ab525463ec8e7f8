"""close() is final (E8): once it returns, no consumer call runs or starts, in every
delivery mode, even with ``polling_shutdown_timeout_ms = 0`` (stop at once); and a
close that times out says so instead of returning as if the engine had stopped."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tidemark.engine.engine import Engine, TaskTimeoutError
from tidemark.engine.state import State
from tidemark.source.synthetic import SyntheticConnector
from waiting import wait_for

MODES = ["batch", "ordered", "async", "per_key"]
# After close() returned, how long to watch for a late call: the old engine's stray
# calls came within a few milliseconds.
WATCH_S = 0.3


class _Calls:
    """Counts consumer calls, those running, and any that starts after close()."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = 0
        self.running = 0
        self.closed = False
        self.after_close = 0
        self.enough = threading.Event()

    def enter(self) -> None:
        with self.lock:
            self.started += 1
            self.running += 1
            if self.closed:
                self.after_close += 1
            if self.started >= 50:
                self.enough.set()

    def leave(self) -> None:
        with self.lock:
            self.running -= 1


def _consumer(mode: str, calls: _Calls, pause_s: float) -> Any:
    def consume(record: Any) -> None:
        calls.enter()
        try:
            time.sleep(pause_s)
        finally:
            calls.leave()

    class Batches:
        def handle_batch(self, records: list[Any], committer: Any) -> None:
            consume(records)

    return Batches() if mode == "batch" else consume


@pytest.mark.parametrize("mode", MODES)
def test_no_consumer_call_runs_or_starts_after_close_returned(mode: str) -> None:
    calls = _Calls()
    engine = Engine(SyntheticConnector(total=None, batch_size=100),
                    _consumer(mode, calls, 0.02 if mode == "batch" else 0.001),
                    config={"delivery_mode": mode, "worker_count": 4,
                            "polling_shutdown_timeout_ms": 0, "max_in_flight": 2_000})
    runner = threading.Thread(target=engine.run)
    runner.start()
    assert calls.enough.wait(30), "the consumer was not called"
    engine.close()
    with calls.lock:
        calls.closed = True
        running = calls.running
    threading.Event().wait(WATCH_S)
    runner.join(30)
    assert engine.state is State.STOPPED
    assert running == 0, f"{mode}: {running} consumer calls still running after close()"
    assert calls.after_close == 0, \
        f"{mode}: {calls.after_close} consumer calls started after close() returned"


def test_close_raises_when_the_engine_is_not_stopped_in_time() -> None:
    """A consumer that blocks past close's timeout: close names the state and the
    timeout instead of returning as if stopped."""
    release = threading.Event()
    entered = threading.Event()

    def consume(record: Any) -> None:
        entered.set()
        release.wait(30)

    engine = Engine(SyntheticConnector(total=None, batch_size=10), consume,
                    config={"delivery_mode": "async", "worker_count": 2,
                            "polling_shutdown_timeout_ms": 0})
    runner = threading.Thread(target=engine.run)
    runner.start()
    try:
        assert entered.wait(30)
        with pytest.raises(TaskTimeoutError, match=r"STOPPING, not STOPPED, 0.2s after close"):
            engine.close(timeout_s=0.2)
    finally:
        release.set()
        runner.join(30)
    assert engine.state is State.STOPPED
    engine.close()  # once stopped, close returns


def test_close_raises_when_a_consumer_call_outlives_the_task_timeout() -> None:
    release = threading.Event()
    entered = threading.Event()

    class Blocking:
        def handle_batch(self, records: list[Any], committer: Any) -> None:
            entered.set()
            release.wait(30)

    engine = Engine(SyntheticConnector(total=None, batch_size=10), Blocking(),
                    config={"delivery_mode": "batch", "polling_shutdown_timeout_ms": 0,
                            "task_management_timeout_ms": 200})
    runner = threading.Thread(target=engine.run)
    runner.start()
    try:
        assert entered.wait(30)
        with pytest.raises(TaskTimeoutError, match="task_management_timeout_ms=200"):
            engine.close()
    finally:
        release.set()
        runner.join(30)
    # Said once: the engine is STOPPED, and a later close() (a with block's exit)
    # returns as for any stopped engine.
    assert engine.state is State.STOPPED
    engine.close()


@pytest.mark.parametrize("abandoned", [False, True], ids=["poll-returns-in-time",
                                                          "poll-outlives-the-stop"])
@pytest.mark.parametrize("pause_s", [0.0, 0.02], ids=["reader-thread", "worker"])
def test_a_batch_polled_while_closing_is_not_handed_on(pause_s: float,
                                                       abandoned: bool) -> None:
    """A poll in progress when close() is called returns a batch after it: with
    ``polling_shutdown_timeout_ms = 0`` no consumer call starts for it, neither while
    close() waits for the poll nor after the engine gave up on it (STOPPED); its
    offset is not saved, so it comes again after a restart. A fast consumer runs in
    the reader's thread (``reader-thread``), a slower one in a worker."""
    calls = _Calls()
    in_poll = threading.Event()
    release = threading.Event()

    def hook(task: Any) -> None:
        if task.polls > 5:
            in_poll.set()
            release.wait(30)

    engine = Engine(SyntheticConnector(total=None, batch_size=10, poll_hook=hook),
                    _consumer("batch", calls, pause_s),
                    config={"delivery_mode": "batch", "polling_shutdown_timeout_ms": 0,
                            "task_management_timeout_ms": 300 if abandoned else 30_000})
    runner = threading.Thread(target=engine.run)
    runner.start()
    try:
        assert in_poll.wait(30)
        wait_for(lambda: calls.started == 5 and calls.running == 0, 30,
                 "the batches polled before to be consumed")
        with calls.lock:
            calls.closed = True
        if abandoned:
            with pytest.raises(TaskTimeoutError, match="task_management_timeout_ms=300"):
                engine.close()
            assert engine.state is State.STOPPED
            release.set()
        else:
            closer = threading.Thread(target=engine.close)
            closer.start()
            wait_for(lambda: engine.state is not State.POLLING_TASKS, 10, "close to begin")
            release.set()
            closer.join(30)
            assert engine.state is State.STOPPED
        threading.Event().wait(WATCH_S)
    finally:
        release.set()
        runner.join(30)
    assert calls.after_close == 0, f"{calls.after_close} consumer calls after close()"
