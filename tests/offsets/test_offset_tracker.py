"""The contiguous offset tracker: never commits past an unprocessed record."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.engine.offset_tracker import OffsetTracker


@settings(max_examples=300, deadline=None)
@given(st.data(), st.integers(min_value=1, max_value=60))
def test_committed_offset_never_passes_an_unprocessed_record(data: st.DataObject,
                                                             count: int) -> None:
    tracker: OffsetTracker[int] = OffsetTracker()
    # Every entry carries its own position as offset, some carry none; an entry stands
    # for 0-3 records.
    carries = data.draw(st.lists(st.booleans(), min_size=count, max_size=count))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=count, max_size=count))
    seqs = [tracker.track(i if c else None, n)
            for i, (c, n) in enumerate(zip(carries, sizes, strict=True))]
    order = data.draw(st.permutations(seqs))
    done: set[int] = set()
    passed = 0
    for seq in order:
        passed += tracker.complete(seq)
        done.add(seq)
        committed = tracker.committable
        if committed is not None:
            # everything up to and including the committed record is processed
            assert all(i in done for i in range(committed + 1))
        # and it is the highest such offset
        contiguous = 0
        while contiguous in done:
            contiguous += 1
        carried = [i for i in range(contiguous) if carries[i]]
        assert committed == (carried[-1] if carried else None)
        # the records passed are those of the contiguous entries, each counted once
        assert passed == sum(sizes[:contiguous])
    assert tracker.in_flight == 0


def test_take_committable_reports_each_advance_once() -> None:
    tracker: OffsetTracker[str] = OffsetTracker()
    a, b = tracker.track("A"), tracker.track("B")
    tracker.complete(b)
    assert tracker.take_committable() is None  # a is still in flight
    tracker.complete(a)
    assert tracker.take_committable() == "B"
    assert tracker.take_committable() is None


def test_completing_twice_or_unknown_records_is_an_error() -> None:
    tracker: OffsetTracker[int] = OffsetTracker()
    seq = tracker.track(1)
    tracker.complete(seq)
    with pytest.raises(ValueError, match="not in flight"):
        tracker.complete(seq)
    with pytest.raises(ValueError, match="not in flight"):
        tracker.complete(99)


def test_concurrent_completion() -> None:
    tracker: OffsetTracker[int] = OffsetTracker()
    seqs = [tracker.track(i) for i in range(20_000)]
    chunks = [seqs[i::4] for i in range(4)]

    def work(chunk: list[int]) -> None:
        for seq in reversed(chunk):
            tracker.complete(seq)

    threads = [threading.Thread(target=work, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tracker.committable == 19_999 and tracker.in_flight == 0
