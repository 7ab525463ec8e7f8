"""Which worker processes each key in per-key delivery.

Order per key only needs the records of one key to be processed one at a time, in
source order. A key therefore stays on its worker while any of its records is in flight
there; a key with nothing in flight goes to the worker with the fewest records in
flight. Hashing keys onto workers instead would leave the order the same but the load
uneven: with 1,000 equally busy keys on 16 workers the busiest worker gets 1.2 to 1.4x the
average, and everyone waits for it (a hot key or an unlucky hash is worse).

The assigner is used by the one thread that dispatches batches. A group of records for
one worker is numbered per worker, and a worker finishes its groups in that order, so
"is this key in flight" is one comparison: the number of the key's last group against
the worker's last finished group. The workers only write that number
(:meth:`KeyAssigner.finished`); a key seen as still in flight for a little longer than
it is only stays on its worker, which is always safe.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

R = TypeVar("R")

_PRUNE_AT_LEAST = 4096


class KeyGroup(Generic[R]):
    """The records of one batch for one worker: hand it back to
    :meth:`KeyAssigner.finished` once they are all processed."""

    __slots__ = ("number", "records", "worker")

    def __init__(self, worker: int, number: int, records: list[R]) -> None:
        self.worker = worker
        self.number = number
        self.records = records


class KeyAssigner(Generic[R]):
    """Splits batches into one group per worker, keeping each key on one worker while it
    has records in flight."""

    def __init__(self, workers: int, key_of: Callable[[R], Hashable]) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.workers = workers
        self._key_of = key_of
        # key -> [worker, number of the key's last group on that worker]. Keys whose
        # group is finished are pruned now and then, so its size stays a small multiple
        # of the keys in flight, however many keys the stream has.
        self._keys: dict[Hashable, list[int]] = {}
        self._prune_at = _PRUNE_AT_LEAST
        self._sent = [0] * workers  # groups given to each worker, numbered from 1
        self._records_sent = [0] * workers
        # Written by the threads that finish groups, read by the dispatching thread.
        self._done = [0] * workers  # the number of each worker's last finished group
        self._records_done = [0] * workers

    def assign(self, records: Sequence[R]) -> list[KeyGroup[R]]:
        """The non-empty groups of *records* (each in source order), by worker."""
        workers = self.workers
        sent = self._sent
        done = self._done
        numbers = [n + 1 for n in sent]
        loads = [s - d for s, d in zip(self._records_sent, self._records_done, strict=True)]
        groups: list[list[R]] = [[] for _ in range(workers)]
        known = self._keys
        key_of = self._key_of
        for record in records:
            key = key_of(record)
            entry = known.get(key)
            if entry is not None and done[entry[0]] < entry[1]:
                worker = entry[0]  # in flight there: it stays
                entry[1] = numbers[worker]
            else:
                worker = loads.index(min(loads))
                if entry is None:
                    known[key] = [worker, numbers[worker]]
                else:
                    entry[0] = worker
                    entry[1] = numbers[worker]
            loads[worker] += 1
            groups[worker].append(record)
        out = []
        for worker, group in enumerate(groups):
            if group:
                sent[worker] += 1
                self._records_sent[worker] += len(group)
                out.append(KeyGroup(worker, sent[worker], group))
        if len(known) > self._prune_at:
            self._prune()
        return out

    def finished(self, group: KeyGroup[R]) -> None:
        """All records of *group* are processed (any thread; a worker's groups finish in
        the order they were assigned)."""
        self._records_done[group.worker] += len(group.records)
        self._done[group.worker] = group.number

    def in_flight(self) -> dict[Hashable, int]:
        """``key -> worker`` of the keys with records in flight (tests, diagnostics)."""
        done = self._done
        return {key: entry[0] for key, entry in self._keys.items()
                if done[entry[0]] < entry[1]}

    def _prune(self) -> None:
        done = self._done
        self._keys = {key: entry for key, entry in self._keys.items()
                      if done[entry[0]] < entry[1]}
        self._prune_at = max(_PRUNE_AT_LEAST, 2 * len(self._keys))
