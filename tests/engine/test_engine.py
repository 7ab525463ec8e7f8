"""The engine on the synthetic connector: delivery modes, ordering, offsets, failures,
retries, backpressure, shutdown, lifecycle (fast; no database)."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from tidemark.engine import delivery, task_runner
from tidemark.engine.converters import ConvertedRecord, EventConverter
from tidemark.engine.engine import Engine, EngineCallbacks, TaskTimeoutError
from tidemark.engine.flow_control import Capacity
from tidemark.engine.key_assignment import KeyAssigner, KeyGroup
from tidemark.engine.state import IllegalStateError, State
from tidemark.errors import ConfigError, TransientError
from tidemark.event import ChangeEvent
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.offsets.store import Offset
from tidemark.source.synthetic import SyntheticConnector, SyntheticTask
from tidemark.testing.sink import MemorySink

MODES = ["batch", "ordered", "async", "per_key"]


def config(mode: str, **settings: Any) -> dict[str, Any]:
    return {"delivery_mode": mode, "worker_count": 4, "offset_flush_interval_ms": 0,
            **settings}


def run_in_thread(engine: Engine) -> threading.Thread:
    def run() -> None:
        try:
            engine.run()
        except BaseException as err:  # the test reads engine.error
            engine.error = engine.error or err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_for(condition: Any, timeout_s: float = 20, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class WatchedCapacity(Capacity):
    """The engine's in-flight limit, counting the reader's waits for room: a reader
    refused by the limit waits one slice and then calls ``while_waiting`` before it
    checks again, so each count is one refusal that the reader has come back from."""

    made: list[WatchedCapacity] = []

    def __init__(self, limit: int, cancelled: Any, while_waiting: Any = lambda: None,
                 **kwargs: Any) -> None:
        self.refusals = 0

        def counted() -> None:
            self.refusals += 1
            while_waiting()

        super().__init__(limit, cancelled, counted, **kwargs)
        WatchedCapacity.made.append(self)


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> list[WatchedCapacity]:
    """Every task runner's capacity, as made (one per task)."""
    made: list[WatchedCapacity] = []
    monkeypatch.setattr(WatchedCapacity, "made", made)
    monkeypatch.setattr(task_runner, "Capacity", WatchedCapacity)
    return made


def wait_until_refused_again(capacity: WatchedCapacity, times: int = 2) -> None:
    """Until the reader has been refused *times* more times: the last of them came back
    to the limit after this call, with all the room there was to have by then (a wait
    that began before the call ends first)."""
    start = capacity.refusals
    wait_for(lambda: capacity.refusals >= start + times, what="the reader to wait for room")


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_delivers_every_record_once_and_commits_the_end(mode: str) -> None:
    connector = SyntheticConnector(total=5_000, batch_size=300, tasks=2)
    sink = MemorySink()
    store = MemoryOffsetStore()
    engine = Engine(connector, sink, config=config(mode, tasks_max=2), offset_store=store)
    engine.run()
    assert engine.state is State.STOPPED
    for task in connector.created:
        assert store.load(task.partition) == {"position": 5_000}
        assert task.committed[-1] == {"position": 5_000}
        assert not task.active
    positions = sorted(sink.positions())
    assert positions == sorted(list(range(5_000)) * 2)


def test_ordered_mode_keeps_source_order() -> None:
    connector = SyntheticConnector(total=3_000, batch_size=128)
    sink = MemorySink()
    Engine(connector, sink, config=config("ordered")).run()
    assert sink.positions() == list(range(3_000))


def test_per_key_mode_keeps_order_per_key_under_random_delays_and_runs_in_parallel() -> None:
    rng = random.Random(7)
    seen: dict[Any, list[int]] = defaultdict(list)
    lock = threading.Lock()
    active = [0, 0]  # now, most at once

    def consumer(record: ConvertedRecord) -> None:
        with lock:
            active[0] += 1
            active[1] = max(active[1], active[0])
        time.sleep(rng.random() / 2000)
        event = record.event
        assert isinstance(event, ChangeEvent) and event.lsn is not None
        with lock:
            seen[event.key["id"] if event.key else None].append(event.lsn)
            active[0] -= 1

    connector = SyntheticConnector(total=4_000, batch_size=200, keys=50)
    Engine(connector, consumer, config=config("per_key", worker_count=8),
           converter=EventConverter()).run()
    assert sum(len(v) for v in seen.values()) == 4_000
    for positions in seen.values():
        assert positions == sorted(positions)
    assert active[1] > 1, "records of different keys never ran in parallel"


def test_async_mode_runs_records_concurrently() -> None:
    active = [0, 0]
    lock = threading.Lock()

    def consumer(record: ConvertedRecord) -> None:
        with lock:
            active[0] += 1
            active[1] = max(active[1], active[0])
        time.sleep(0.002)
        with lock:
            active[0] -= 1

    connector = SyntheticConnector(total=400, batch_size=200)
    Engine(connector, consumer, config=config("async", worker_count=8)).run()
    assert active[1] >= 4


class CheckingStore(MemoryOffsetStore):
    """Fails the test if an offset is saved before every record below it was processed."""

    def __init__(self, processed: set[int], lock: threading.Lock) -> None:
        super().__init__()
        self.processed = processed
        self.lock = lock
        self.saves = 0

    def save(self, key: str, offset: Offset) -> None:
        with self.lock:
            missing = set(range(offset["position"])) - self.processed
        assert not missing, f"offset {offset} saved before {sorted(missing)[:5]} processed"
        self.saves += 1
        super().save(key, offset)


@pytest.mark.parametrize("mode", ["async", "per_key"])
def test_committed_offset_never_passes_an_unprocessed_record(mode: str) -> None:
    processed: set[int] = set()
    lock = threading.Lock()
    rng = random.Random(3)

    def consumer(record: ConvertedRecord) -> None:
        time.sleep(rng.random() / 5000)
        event = record.event
        assert isinstance(event, ChangeEvent) and event.lsn is not None
        if record.value is not None:
            with lock:
                processed.add(event.lsn)

    store = CheckingStore(processed, lock)
    connector = SyntheticConnector(total=3_000, batch_size=100, keys=30)
    Engine(connector, consumer, config=config(mode, worker_count=6, max_in_flight=300),
           offset_store=store).run()
    assert store.saves > 5
    assert store.load(connector.created[0].partition) == {"position": 3_000}


@pytest.mark.parametrize("mode", MODES)
def test_a_failing_consumer_stops_every_task_and_run_raises_its_error(mode: str) -> None:
    connector = SyntheticConnector(total=None, batch_size=100, tasks=2)
    sink = MemorySink(fail_at=1_000)
    store = MemoryOffsetStore()
    engine = Engine(connector, sink, config=config(mode, tasks_max=2), offset_store=store)
    with pytest.raises(RuntimeError, match="sink failed"):
        engine.run()
    assert engine.state is State.STOPPED
    assert all(not task.active for task in connector.created)
    delivered = len(sink)
    for task in connector.created:
        saved = store.load(task.partition)
        # Never beyond what was delivered (both tasks share the sink's count).
        assert saved is None or saved["position"] <= delivered


def test_a_retriable_poll_error_is_retried_in_place() -> None:
    failures = {"left": 3}

    def hook(task: SyntheticTask) -> None:
        if task.polls == 2 and failures["left"]:
            failures["left"] -= 1
            task.polls -= 1  # the same poll again
            raise TransientError("connection dropped (as asked)")

    connector = SyntheticConnector(total=1_000, batch_size=100, poll_hook=hook)
    sink = MemorySink()
    Engine(connector, sink, config=config("ordered", errors_retry_delay_initial_ms=1)).run()
    assert failures["left"] == 0
    assert sink.positions() == list(range(1_000))


def test_retries_stop_at_errors_max_retries() -> None:
    def hook(task: SyntheticTask) -> None:
        raise TransientError("still down")

    connector = SyntheticConnector(total=1_000, poll_hook=hook)
    engine = Engine(connector, MemorySink(),
                    config=config("ordered", errors_max_retries=2,
                                  errors_retry_delay_initial_ms=1))
    with pytest.raises(TransientError, match="still down"):
        engine.run()
    assert connector.created[0].polls == 3


def test_a_non_retriable_source_error_is_not_retried() -> None:
    def hook(task: SyntheticTask) -> None:
        raise ValueError("corrupt input")

    connector = SyntheticConnector(total=1_000, poll_hook=hook)
    with pytest.raises(ValueError, match="corrupt input"):
        Engine(connector, MemorySink(), config=config("batch")).run()
    assert connector.created[0].polls == 1


def test_close_while_tasks_start_waits_for_every_task_and_leaks_nothing() -> None:
    events: list[str] = []
    callbacks = EngineCallbacks(task_started=lambda i: events.append(f"started {i}"),
                                task_stopped=lambda i: events.append(f"stopped {i}"))
    # Starting takes long enough that close() surely lands while tasks are starting,
    # even on a slow machine (close() waits for the starts, then stops at once).
    connector = SyntheticConnector(total=None, tasks=3, start_delay_s=3)
    engine = Engine(connector, MemorySink(), config=config("batch", tasks_max=3),
                    callbacks=callbacks)
    thread = run_in_thread(engine)
    wait_for(lambda: engine.state is State.STARTING_TASKS, what="STARTING_TASKS")
    engine.close()
    assert engine.state is State.STOPPED
    thread.join(10)
    assert engine.error is None
    assert len(connector.created) == 3
    assert all(not task.active for task in connector.created), "a task was left open"
    assert sorted(events) == ["started 0", "started 1", "started 2",
                              "stopped 0", "stopped 1", "stopped 2"]
    assert all(task.polls == 0 for task in connector.created)


def test_stopped_is_final() -> None:
    engine = Engine(SyntheticConnector(total=10), MemorySink())
    engine.run()
    with pytest.raises(IllegalStateError, match="create a new engine"):
        engine.run()
    engine.close()  # closing again is harmless


def test_close_before_run_and_closing_twice() -> None:
    engine = Engine(SyntheticConnector(total=10), MemorySink())
    engine.close()
    engine.close()
    assert engine.state is State.STOPPED
    with pytest.raises(IllegalStateError):
        engine.run()


@pytest.mark.parametrize(("delay_s", "where"), [(0.0, "task"), (0.005, "lane")])
def test_a_quick_batch_consumer_runs_in_the_task_thread_a_slow_one_in_its_own(
        delay_s: float, where: str) -> None:
    """Handing each batch to another thread costs a quick consumer more than its work
    (the two threads trade the GIL), so it runs in the task's thread while nothing is
    queued for it; the first batch, every batch after a slow one, and batches that
    come while the lane is still busy go to the lane."""
    threads: list[str] = []
    store = MemoryOffsetStore()

    class Consumer:
        def handle_batch(self, records: list[ConvertedRecord], committer: Any) -> None:
            threads.append(threading.current_thread().name)
            if delay_s:  # (even sleep(0) gives up the GIL, making the call slow)
                time.sleep(delay_s)

    total = 20_000 if where == "task" else 2_000
    connector = SyntheticConnector(total=total, batch_size=100)
    Engine(connector, Consumer(), config=config("batch"), offset_store=store).run()
    assert len(threads) == total // 100 and "-batch0" in threads[0]
    in_task = threads.count("tidemark-task0")
    if where == "task":
        # Once the lane has caught up (it waits for the GIL while the reader works).
        # How many batches that takes depends on the machine's load (a busy CI host
        # keeps the lane busy longer), so only the switch itself is asserted.
        assert in_task >= 1, threads
    else:
        assert in_task == 0 and set(threads) == {threads[0]}
    assert store.load(connector.created[0].partition) == {"position": total}


def test_a_task_whose_thread_is_stuck_in_a_consumer_is_stopped_when_it_comes_back() -> None:
    """close() stops waiting after task_management_timeout_ms and says that a consumer
    call outlived the stop; the task's thread, stuck in a consumer called in it, stops
    the task itself once the consumer returns."""
    release = threading.Event()
    stuck = threading.Event()

    class Consumer:
        def handle_batch(self, records: list[ConvertedRecord], committer: Any) -> None:
            if threading.current_thread().name == "tidemark-task0":
                stuck.set()
                release.wait()

    connector = SyntheticConnector(total=None, batch_size=100)
    engine = Engine(connector, Consumer(),
                    config=config("batch", task_management_timeout_ms=300,
                                  polling_shutdown_timeout_ms=0))
    thread = run_in_thread(engine)
    assert stuck.wait(10), "the consumer was never called in the task's thread"
    # Which stage of the stop gives up first depends on the machine's load: either says
    # the consumer call outlived the stop.
    with pytest.raises(TaskTimeoutError, match=r"still in poll\(\) or a consumer call|"
                                               r"its consumer\) did not stop within"):
        engine.close()
    thread.join(10)
    assert engine.state is State.STOPPED
    task = connector.created[0]
    assert task.active  # still inside the consumer
    release.set()
    wait_for(lambda: not task.active, what="the task's thread to stop the task")


@pytest.mark.parametrize("mode", MODES)
def test_a_slow_consumer_holds_the_reader_back(mode: str,
                                               watched: list[WatchedCapacity]) -> None:
    release = threading.Event()

    def consumer(record: ConvertedRecord) -> None:
        release.wait()

    class BlockingBatch:
        def handle_batch(self, records: list[ConvertedRecord], committer: Any) -> None:
            release.wait()

    connector = SyntheticConnector(total=None, batch_size=100)
    engine = Engine(connector, BlockingBatch() if mode == "batch" else consumer,
                    config=config(mode, max_in_flight=500, polling_shutdown_timeout_ms=0))
    thread = run_in_thread(engine)

    def refused() -> bool:
        position = connector.created[0].position if connector.created else 0
        assert position <= 500 + 100, f"the reader went on to {position} past the limit"
        return bool(watched and watched[0].refusals)

    wait_for(refused, what="the reader to fill the limit")
    # Refused, and refused again after a wait: a reader that went on past the limit
    # would have read more by now.
    wait_until_refused_again(watched[0])
    # The reader may hold one more batch than the limit while it waits for room.
    assert connector.created[0].position <= 500 + 100
    release.set()
    engine.close()
    thread.join(10)
    assert engine.state is State.STOPPED


@pytest.mark.parametrize("mode", ["async", "per_key"])
def test_one_stuck_record_holds_the_reader_back_while_the_other_workers_go_on(
        mode: str, watched: list[WatchedCapacity], monkeypatch: pytest.MonkeyPatch) -> None:
    """Records processed after one that is not are redelivered after a crash too, so
    they count against the in-flight limit until the stuck one is done."""
    stuck = 99  # the last record of the first batch: in async mode, of its last chunk
    release = threading.Event()
    started: set[int] = set()
    processed = [0]
    lock = threading.Lock()

    def consumer(record: ConvertedRecord) -> None:
        event = record.event
        assert isinstance(event, ChangeEvent) and event.lsn is not None
        with lock:
            started.add(event.lsn)
        if event.lsn == stuck:
            release.wait(30)
        with lock:
            processed[0] += 1

    # Per key, records the assigner gives the stuck record's worker after it wait
    # behind it; which those are depends on how busy the workers were.
    groups: list[tuple[int, list[int]]] = []  # (worker, positions), in dispatch order

    class WatchedAssigner(KeyAssigner[Any]):
        def assign(self, records: Any) -> list[KeyGroup[Any]]:
            out = super().assign(records)
            with lock:
                groups.extend((g.worker, [r.lsn for r in g.records]) for g in out)
            return out

    monkeypatch.setattr(delivery, "KeyAssigner", WatchedAssigner)

    def blocked_behind_the_stuck_one() -> set[int]:
        with lock:
            found = [i for i, (_, positions) in enumerate(groups) if stuck in positions]
            if not found:
                return set()
            worker = groups[found[0]][0]
            return {p for w, positions in groups[found[0] + 1:] if w == worker
                    for p in positions}

    connector = SyntheticConnector(total=5_000, batch_size=100, keys=5_000)
    store = MemoryOffsetStore()
    engine = Engine(connector, consumer, converter=EventConverter(), offset_store=store,
                    config=config(mode, max_in_flight=300))
    thread = run_in_thread(engine)

    def workers_idle_and_reader_waiting() -> bool:
        if not watched or not watched[0].refusals:
            return False
        position = connector.created[0].position
        assert position <= 300 + 100, f"the reader went on to {position} past the limit"
        handed_on = set(range(position - 100))  # the reader holds one batch
        expected = handed_on - blocked_behind_the_stuck_one()
        with lock:
            return started == expected and processed[0] == len(expected) - 1

    wait_for(workers_idle_and_reader_waiting,
             what="the other workers to process all they can while the reader waits")
    # The reader comes back to the limit after all of them were processed: had
    # processed records stopped counting as in flight, it would have gone on by now.
    wait_until_refused_again(watched[0])
    # At most the limit, plus the batch let in while waiting for room, minus the stuck one.
    assert connector.created[0].position <= 300 + 100
    assert processed[0] < 300 + 100
    release.set()
    thread.join(30)
    assert engine.state is State.STOPPED and engine.error is None
    assert processed[0] == 5_000
    assert store.load(connector.created[0].partition) == {"position": 5_000}


@pytest.mark.parametrize("mode", MODES)
def test_several_consumers_all_get_every_record_and_the_offset_waits_for_all(
        mode: str) -> None:
    fast, slow = MemorySink(), MemorySink(delay_s=0.0002)
    store = MemoryOffsetStore()
    connector = SyntheticConnector(total=2_000, batch_size=200)
    Engine(connector, [fast, slow], config=config(mode), offset_store=store).run()
    assert sorted(fast.positions()) == list(range(2_000))
    assert sorted(slow.positions()) == list(range(2_000))
    assert store.load(connector.created[0].partition) == {"position": 2_000}


def test_close_drains_in_flight_records_then_saves_the_offset() -> None:
    sink = MemorySink(delay_s=0.0005)
    store = MemoryOffsetStore()
    connector = SyntheticConnector(total=None, batch_size=100)
    # A bounded in-flight count, so that draining it (0.5 ms a record) fits well within
    # the shutdown timeout even on a slow machine.
    engine = Engine(connector, sink, config=config("ordered", polling_shutdown_timeout_ms=60_000,
                                                   max_in_flight=1_000),
                    offset_store=store)
    thread = run_in_thread(engine)
    wait_for(lambda: len(sink) > 300, what="some records")
    engine.close()
    thread.join(70)
    assert not thread.is_alive()
    saved = store.load(connector.created[0].partition)
    assert saved is not None
    assert sink.positions() == list(range(len(sink)))
    assert saved["position"] == len(sink), "drained records were not committed"


def test_restart_resumes_from_the_saved_offset() -> None:
    store = MemoryOffsetStore()
    first = MemorySink()
    connector = SyntheticConnector(total=None, batch_size=100)
    engine = Engine(connector, first, config=config("batch"), offset_store=store)
    thread = run_in_thread(engine)
    wait_for(lambda: len(first) > 1_000, what="some records")
    engine.close()
    thread.join(10)
    saved = store.load(connector.created[0].partition)
    assert saved is not None
    second = MemorySink()
    Engine(SyntheticConnector(total=saved["position"] + 500, batch_size=100), second,
           config=config("batch"), offset_store=store).run()
    assert second.positions() == list(range(saved["position"], saved["position"] + 500))


def test_run_with_task_exposes_the_running_tasks() -> None:
    connector = SyntheticConnector(total=None, tasks=2)
    engine = Engine(connector, MemorySink(), config=config("batch", tasks_max=2))
    try:
        partitions = engine.run_with_task(lambda task: task.partition)
    finally:
        engine.close()
    assert partitions == ["synthetic/synthetic/0", "synthetic/synthetic/1"]
    assert engine.state is State.STOPPED


def test_a_record_processor_takes_over_processing() -> None:
    batches: list[int] = []

    class Processor:
        def process(self, records: list[Any], context: Any) -> None:
            converted = context.convert(records)
            batches.append(len(converted))

    store = MemoryOffsetStore()
    connector = SyntheticConnector(total=1_000, batch_size=250)
    Engine(connector, Processor(), offset_store=store).run()
    assert batches == [250, 250, 250, 250]
    assert store.load(connector.created[0].partition) == {"position": 1_000}


def test_configuration_errors_name_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"delivery_mode.*'batchy' is not allowed; choose "
                                          r"one of batch, ordered, async, per_key"):
        Engine(SyntheticConnector(), MemorySink(), config={"delivery_mode": "batchy"})
    with pytest.raises(ConfigError, match="pool_size: unknown setting; allowed settings are"):
        Engine(SyntheticConnector(), MemorySink(), config={"pool_size": 3})
    with pytest.raises(ConfigError, match="'batch' needs consumers with handle_batch"):
        Engine(SyntheticConnector(), print, config={"delivery_mode": "batch"})
    with pytest.raises(ConfigError, match="raise tasks_max to at least 2"):
        Engine(SyntheticConnector(tasks=2), MemorySink()).run()
