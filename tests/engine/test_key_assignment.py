"""Per-key delivery's worker assignment: a key never runs on two workers at once, and
keys with nothing in flight spread over the least busy workers (fast; no database)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Hashable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.engine.converters import ConvertedRecord, EventConverter
from tidemark.engine.engine import Engine
from tidemark.engine.key_assignment import KeyAssigner, KeyGroup
from tidemark.event import ChangeEvent
from tidemark.source.synthetic import SyntheticConnector


def identity(key: str) -> Hashable:
    return key


@given(
    workers=st.integers(1, 5),
    batches=st.lists(st.lists(st.sampled_from("abcdefg"), max_size=12), max_size=8),
    data=st.data(),
)
def test_a_key_in_flight_stays_on_its_worker_whatever_finishes_when(
        workers: int, batches: list[list[str]], data: st.DataObject) -> None:
    assigner: KeyAssigner[str] = KeyAssigner(workers, identity)
    in_flight: list[KeyGroup[str]] = []  # per worker, finished in order
    for batch in batches:
        # Some workers finish some of their groups (each its own in order) before the
        # next batch.
        for worker in range(workers):
            mine = [group for group in in_flight if group.worker == worker]
            for group in mine[:data.draw(st.integers(0, len(mine)))]:
                assigner.finished(group)
                in_flight.remove(group)
        busy = {key: group.worker for group in in_flight for key in group.records}
        assert assigner.in_flight() == busy
        groups = assigner.assign(batch)
        assert sorted(r for group in groups for r in group.records) == sorted(batch)
        assert len({group.worker for group in groups}) == len(groups)
        for group in groups:
            for key in group.records:
                assert busy.setdefault(key, group.worker) == group.worker, (
                    f"key {key!r} assigned to worker {group.worker} while in flight on "
                    f"worker {busy[key]}")
        for group in groups:
            # Source order within a worker: the batch's order restricted to it.
            assert group.records == [r for r in batch if busy[r] == group.worker]
            in_flight.append(group)
    for group in in_flight:
        assigner.finished(group)
    assert assigner.in_flight() == {}


def by_worker(groups: list[KeyGroup[str]], workers: int) -> list[list[str]]:
    out: list[list[str]] = [[] for _ in range(workers)]
    for group in groups:
        out[group.worker] = group.records
    return out


def test_new_keys_go_to_the_least_busy_worker() -> None:
    assigner: KeyAssigner[str] = KeyAssigner(3, identity)
    groups = assigner.assign(["a", "a", "a", "b", "c", "d"])
    assert by_worker(groups, 3) == [["a", "a", "a"], ["b", "d"], ["c"]]
    assigner.finished(groups[0])  # worker 0 is done with "a": a is free to move
    groups = assigner.assign(["b", "a", "e"])
    assert by_worker(groups, 3) == [["a", "e"], ["b"], []]
    assert assigner.in_flight() == {"a": 0, "b": 1, "c": 2, "d": 1, "e": 0}


def test_keys_long_finished_are_forgotten() -> None:
    assigner: KeyAssigner[int] = KeyAssigner(2, lambda key: key)
    for start in range(0, 100_000, 1_000):
        for group in assigner.assign(range(start, start + 1_000)):
            assigner.finished(group)
    assert len(assigner._keys) <= 5_000
    assert assigner.in_flight() == {}


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers must be at least 1, got 0"):
        KeyAssigner(0, identity)


def test_per_key_delivery_spreads_as_many_keys_as_workers_one_per_worker() -> None:
    """With hashing, four keys on four workers would often share a worker and leave
    another idle; the engine puts each on its own, and each key on one thread."""
    threads: dict[Hashable, set[str]] = defaultdict(set)
    lock = threading.Lock()

    def consumer(record: ConvertedRecord) -> None:
        time.sleep(0.001)
        event = record.event
        assert isinstance(event, ChangeEvent) and event.key is not None
        with lock:
            threads[event.key["id"]].add(threading.current_thread().name)

    connector = SyntheticConnector(total=80, batch_size=80, keys=4)
    Engine(connector, consumer, converter=EventConverter(),
           config={"delivery_mode": "per_key", "worker_count": 4}).run()
    assert sorted(threads) == [0, 1, 2, 3]
    assert all(len(names) == 1 for names in threads.values()), threads
    assert len(set.union(*threads.values())) == 4, threads
