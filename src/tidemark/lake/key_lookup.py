"""The key index's lookup from a 64-bit key hash to row numbers: :class:`HashLookup`.

Entries live in buckets by the top bits of their hash, each bucket a sorted *base* and a
sorted *recent* level. A batch's entries are merged into the recent levels of their
buckets, each small; :meth:`HashLookup.maintain` merges the recent level of a few
buckets into their base per call, in turn, dropping the entries of rows no longer alive.
No call passes over the whole lookup, so no batch waits for one: with one sorted array
for the whole table, merging its recent level into it took 0.9 s at 10M rows about every
570 batches of 10,000 changes, and dropping its dead entries (a rebuild) 1.6 s (measured
with ``bench_merge_on_read.py``). A bucket splits in two when the buckets hold more than
``_BUCKET_MAX`` entries each on average: slices of its arrays, nothing copied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import numpy as np

#: Entries a bucket holds on average before every bucket splits in two.
_BUCKET_MAX = 1 << 17
#: Calls of :meth:`HashLookup.maintain` in which every bucket is maintained once (with
#: fewer buckets than this, one bucket a call).
_CYCLE = 32
_MAX_BITS: Final = 16

_U64 = np.dtype(np.uint64)

Level = tuple[np.ndarray[Any, np.dtype[np.uint64]], np.ndarray[Any, np.dtype[np.int64]]]
"""Hashes, sorted, and the row number of each."""


def _empty() -> Level:
    return np.zeros(0, _U64), np.zeros(0, np.int64)


def merged_levels(first: Level, second: Level) -> Level:
    """Two lookup levels (hashes sorted, with their row numbers) as one, sorted."""
    if not len(first[0]):
        return second
    if not len(second[0]):
        return first
    at = np.searchsorted(first[0], second[0], side="right")
    return np.insert(first[0], at, second[0]), np.insert(first[1], at, second[1])


def _alive_only(level: Level, alive: np.ndarray[Any, Any]) -> Level:
    keep = alive[level[1]]
    if keep.all():
        return level
    return level[0][keep], level[1][keep]


class HashLookup:
    """Row numbers by 64-bit hash, in buckets (see the module's docstring)."""

    def __init__(self) -> None:
        self._bits = 0
        self._base: list[Level] = [_empty()]
        self._recent: list[Level] = [_empty()]
        self._cursor = 0
        self._entries = 0

    def __len__(self) -> int:
        """Entries held, those of dead rows not yet dropped included."""
        return self._entries

    @property
    def buckets(self) -> int:
        """How many buckets the entries are in."""
        return len(self._base)

    def nbytes(self) -> int:
        """The bytes the entries take (a bucket split off another may keep the whole
        array it was cut from until its next maintenance)."""
        return sum(int(h.nbytes) + int(n.nbytes) for h, n in (*self._base, *self._recent))

    def _cuts(self, hashes: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Where each bucket's part of the sorted *hashes* starts, and their end."""
        if not self._bits:
            return np.asarray([0, len(hashes)], dtype=np.int64)
        edges = np.arange(1, len(self._base), dtype=np.uint64) << np.uint64(64 - self._bits)
        return np.concatenate([[0], np.searchsorted(hashes, edges), [len(hashes)]])

    # -- changing -------------------------------------------------------------------------
    def add(self, hashes: np.ndarray[Any, Any], numbers: np.ndarray[Any, Any]) -> None:
        """Add an entry per hash with its row number."""
        if not len(hashes):
            return
        order = np.argsort(hashes, kind="stable")
        hashes, numbers = hashes[order], numbers[order]
        cuts = self._cuts(hashes)
        for bucket in np.flatnonzero(np.diff(cuts)).tolist():
            start, end = int(cuts[bucket]), int(cuts[bucket + 1])
            self._recent[bucket] = merged_levels(self._recent[bucket],
                                                 (hashes[start:end], numbers[start:end]))
        self._entries += len(hashes)
        while self._entries > _BUCKET_MAX * len(self._base) and self._bits < _MAX_BITS:
            self._split()

    def _split(self) -> None:
        """Every bucket in two, by the next bit of the hash."""
        bits = self._bits + 1
        halves: tuple[list[Level], list[Level]] = ([], [])
        for bucket in range(len(self._base)):
            middle = np.uint64(2 * bucket + 1) << np.uint64(64 - bits)
            for levels, out in zip((self._base, self._recent), halves, strict=True):
                hashes, numbers = levels[bucket]
                at = int(np.searchsorted(hashes, middle))
                out += [(hashes[:at], numbers[:at]), (hashes[at:], numbers[at:])]
        self._base, self._recent = halves
        self._bits = bits
        self._cursor *= 2

    def maintain(self, alive: np.ndarray[Any, Any]) -> None:
        """Merge the recent level of the next buckets in turn into their base (every
        bucket once in ``_CYCLE`` calls), without the entries of rows *alive* marks
        dead."""
        for _ in range(-(-len(self._base) // _CYCLE)):
            bucket = self._cursor % len(self._base)
            self._cursor = bucket + 1
            before = len(self._base[bucket][0]) + len(self._recent[bucket][0])
            self._base[bucket] = merged_levels(_alive_only(self._base[bucket], alive),
                                               _alive_only(self._recent[bucket], alive))
            self._recent[bucket] = _empty()
            self._entries -= before - len(self._base[bucket][0])

    def renumber(self, alive: np.ndarray[Any, Any],
                 renumbered: Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]) -> None:
        """Drop the entries of dead rows and give the others their *renumbered* number
        (the hashes, so the order, do not change)."""
        self._entries = 0
        for levels in (self._base, self._recent):
            for bucket, level in enumerate(levels):
                hashes, numbers = _alive_only(level, alive)
                levels[bucket] = hashes, renumbered(numbers)
                self._entries += len(hashes)

    def repoint(self, old: np.ndarray[Any, Any], new: np.ndarray[Any, Any]) -> None:
        """Change the row number of the entries pointing at *old* to *new*, in place."""
        if not len(old):
            return
        order = np.argsort(old, kind="stable")
        old, new = old[order], new[order]
        low, high = int(old[0]), int(old[-1])
        # A byte per number in the range marks the moved ones: one pass over the entries
        # whatever the range holds besides (a search per entry in it would cost up to
        # the whole lookup when the moved files' numbers are far apart).
        moved = np.zeros(high - low + 1, dtype=bool)
        moved[old - low] = True
        for _, numbers in (*self._base, *self._recent):
            near = np.flatnonzero((numbers >= low) & (numbers <= high))
            near = near[moved[numbers[near] - low]]
            if len(near):
                numbers[near] = new[np.searchsorted(old, numbers[near])]

    # -- reading --------------------------------------------------------------------------
    def find(self, hashes: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any],
                                                           np.ndarray[Any, Any]]:
        """Every entry of each of *hashes*: which of them (its place in *hashes*) and
        its row number, dead rows' included."""
        # Probing in hash order: the searches walk each level forward (half the time of
        # probing in key order into 10M rows, measured).
        order = np.argsort(hashes, kind="stable").astype(np.int64)
        hashes = hashes[order]
        cuts = self._cuts(hashes)
        probes, rows = [], []
        for bucket in np.flatnonzero(np.diff(cuts)).tolist():
            start, end = int(cuts[bucket]), int(cuts[bucket + 1])
            wanted, places = hashes[start:end], order[start:end]
            for level_h, level_r in (self._base[bucket], self._recent[bucket]):
                if not len(level_h):
                    continue
                left = np.searchsorted(level_h, wanted, side="left")
                counts = np.searchsorted(level_h, wanted, side="right") - left
                if not counts.any():
                    continue
                probe = np.repeat(places, counts)
                first = np.repeat(left - np.cumsum(counts) + counts, counts)
                probes.append(probe)
                rows.append(level_r[first + np.arange(len(probe), dtype=np.int64)])
        if not probes:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(probes), np.concatenate(rows)
