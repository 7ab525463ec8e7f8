"""Comparing two checksum sides of one table: bucket sums, splitting the differing
buckets that hold many rows, then the rows of the differing buckets field by field.

Only sums cross from the sides until a bucket differs, so an equal table of any size
costs two scans and a few kilobytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar

from tidemark.row_checksum import (
    BucketSums,
    ChecksumSide,
    KeyedRow,
    KeyLookup,
    RowTexts,
    TableShape,
)
from tidemark.verify.result import Difference

#: Rows per bucket aimed for, and the most buckets of the first comparison.
ROWS_PER_BUCKET: Final = 1000
MAX_BUCKETS: Final = 65_536
#: A differing bucket with more rows than this is split before its rows are fetched.
SPLIT_ABOVE_ROWS: Final = 4096
SPLIT_FACTOR: Final = 64
#: At most this many splits of one bucket (64^3 parts): a bucket still larger then has
#: that many rows differing and its rows are fetched anyway.
MAX_SPLITS: Final = 3
#: Key hashes have 60 bits, so of this many buckets each key hash is its own bucket:
#: the rows of chosen keys are those of the buckets named by their hashes, without
#: fetching every row sharing a bucket with one of them (a side still scans its table,
#: but only those rows leave it).
KEY_BUCKETS: Final = 2**60

_T = TypeVar("_T")


def bucket_count(rows: int) -> int:
    """A power of two near rows / :data:`ROWS_PER_BUCKET`, at most :data:`MAX_BUCKETS`."""
    wanted = max(1, rows // ROWS_PER_BUCKET)
    count = 1
    while count < wanted and count < MAX_BUCKETS:
        count *= 2
    return count


@dataclasses.dataclass
class Comparison:
    """What one comparison of two sides found."""

    rows_compared: int = 0
    differences: list[Difference] = dataclasses.field(default_factory=list)
    rows_fetched: int = 0
    """Rows of differing buckets read from both sides to compare them field by field."""
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds spent per phase: ``source_sums``, ``target_sums`` (the two sides run at
    the same time, so each is that side's own time), ``rows``."""

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        """Add the wall time of the block to *phase*."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - started

    def both(self, source: Callable[[], _T], target: Callable[[], _T],
             phases: tuple[str, str]) -> tuple[_T, _T]:
        """*source()* and *target()* at the same time, each timed as its phase: the
        source side mostly waits for its database and DuckDB releases the GIL while it
        scans, so the two scans overlap instead of adding up."""
        with ThreadPoolExecutor(1, thread_name_prefix="verify-source") as pool:
            mine = pool.submit(self._timed, phases[0], source)
            theirs = self._timed(phases[1], target)
            return mine.result(), theirs

    def _timed(self, phase: str, call: Callable[[], _T]) -> _T:
        with self.timing(phase):
            return call()


def _differing(source: BucketSums, target: BucketSums) -> list[int]:
    return sorted(b for b in source.keys() | target.keys() if source.get(b) != target.get(b))


def _largest(source: BucketSums, target: BucketSums, bucket: int) -> int:
    return max(s.rows for s in (source.get(bucket), target.get(bucket)) if s is not None)


def compare_tables(source: ChecksumSide, target: ChecksumSide, shape: TableShape,
                   buckets: int, *, excluded_keys: frozenset[int] = frozenset(),
                   target_behind: bool = False) -> Comparison:
    """Compare every row of both sides but those whose key hash is in *excluded_keys*."""
    result = Comparison()
    source_sums, target_sums = result.both(
        lambda: source.bucket_sums(shape, buckets, excluded_keys=excluded_keys),
        lambda: target.bucket_sums(shape, buckets, excluded_keys=excluded_keys),
        ("source_sums", "target_sums"))
    result.rows_compared = sum(s.rows for s in source_sums.values())
    # (modulus, buckets of that modulus whose rows are fetched)
    fetch: list[tuple[int, list[int]]] = []
    modulus, differing = buckets, _differing(source_sums, target_sums)
    for _ in range(MAX_SPLITS + 1):
        large = [b for b in differing if _largest(source_sums, target_sums, b)
                 > SPLIT_ABOVE_ROWS]
        small = [b for b in differing if b not in large]
        if small:
            fetch.append((modulus, small))
        if not large or modulus * SPLIT_FACTOR > 2**60:
            if large:
                fetch.append((modulus, large))
            break
        parts = [b + i * modulus for b in large for i in range(SPLIT_FACTOR)]
        modulus *= SPLIT_FACTOR
        source_sums, target_sums = result.both(
            functools.partial(source.bucket_sums, shape, modulus, only=parts,
                              excluded_keys=excluded_keys),
            functools.partial(target.bucket_sums, shape, modulus, only=parts,
                              excluded_keys=excluded_keys),
            ("source_sums", "target_sums"))
        differing = _differing(source_sums, target_sums)
    else:
        if differing:
            fetch.append((modulus, differing))
    for fetch_modulus, fetch_buckets in fetch:
        with result.timing("rows"):
            source_rows, target_rows = result.both(
                functools.partial(source.bucket_rows, shape, fetch_modulus, fetch_buckets,
                                  excluded_keys=excluded_keys),
                functools.partial(target.bucket_rows, shape, fetch_modulus, fetch_buckets,
                                  excluded_keys=excluded_keys),
                ("source_rows", "target_rows"))
        result.rows_fetched += len(source_rows) + len(target_rows)
        found = _row_differences(source_rows, target_rows, shape, target_behind)
        result.differences += [d for _, d in found]
        explained = {key_hash % fetch_modulus for key_hash, _ in found}
        unexplained = [b for b in fetch_buckets if b not in explained]
        if unexplained:
            result.differences.append(_unexplained(unexplained, fetch_modulus,
                                                   target_behind))
    result.differences.sort(key=_order)
    return result


def _unexplained(buckets: Sequence[int], modulus: int, target_behind: bool) -> Difference:
    """Buckets whose sums differ but whose rows compare equal: never "equal"."""
    shown = ", ".join(str(b) for b in buckets[:10]) + (" ..." if len(buckets) > 10 else "")
    return Difference("checksum", {}, (), target_behind, detail=(
        f"{len(buckets)} bucket(s) of {modulus} ({shown}) have different checksums "
        "on the two sides although their rows compare equal: a hash collision or a "
        "fault in one side's checksum; compare the table another way before taking "
        "it as equal"))


def compare_keys(source: ChecksumSide, target: ChecksumSide, shape: TableShape,
                 keys: Iterable[int], *, target_behind: bool = False,
                 key_texts: Mapping[int, RowTexts] | None = None) -> Comparison:
    """Compare only the rows whose key hash is in *keys* (a later round's keys), looked
    up by their key values where *key_texts* has them all and both sides can
    (:class:`KeyLookup`), else by their hashes (a scan of both sides)."""
    wanted = sorted(frozenset(keys))
    if not wanted:
        return Comparison()
    result = Comparison()
    with result.timing("rows"):
        source_rows, target_rows = result.both(
            functools.partial(_rows_of_keys, source, shape, wanted, key_texts),
            functools.partial(_rows_of_keys, target, shape, wanted, key_texts),
            ("source_rows", "target_rows"))
    result.rows_fetched = len(source_rows) + len(target_rows)
    result.rows_compared = len(source_rows)
    result.differences = compare_rows(source_rows, target_rows, shape,
                                      target_behind=target_behind)
    return result


def _rows_of_keys(side: ChecksumSide, shape: TableShape, wanted: Sequence[int],
                  key_texts: Mapping[int, RowTexts] | None) -> list[KeyedRow]:
    """The rows of the key hashes *wanted* (sorted) on *side*."""
    if key_texts is not None and isinstance(side, KeyLookup) \
            and all(k in key_texts for k in wanted):
        found = side.key_rows(shape, [key_texts[k] for k in wanted])
        if found is not None:
            keep = frozenset(wanted)
            return [row for row in found if row[0] in keep]
    return side.bucket_rows(shape, KEY_BUCKETS, wanted)


def compare_rows(source: Sequence[KeyedRow], target: Sequence[KeyedRow],
                 shape: TableShape, *, target_behind: bool = False) -> list[Difference]:
    """The differences between two sides' rows of the same buckets, by key."""
    return sorted((d for _, d in _row_differences(source, target, shape, target_behind)),
                  key=_order)


def _order(difference: Difference) -> tuple[str, list[tuple[str, str | None]]]:
    return difference.kind, sorted(difference.key.items(), key=str)


def _by_key(rows: Sequence[KeyedRow]) -> dict[int, list[RowTexts]]:
    grouped: dict[int, list[RowTexts]] = {}
    for key_hash, texts in rows:
        grouped.setdefault(key_hash, []).append(texts)
    return grouped


def _row_differences(source: Sequence[KeyedRow], target: Sequence[KeyedRow],
                     shape: TableShape, target_behind: bool) -> list[tuple[int, Difference]]:
    """Each differing key's hash and difference. A key held by more than one row on
    either side (a duplicate in the target, an SCD2 key with two current versions) is
    a ``duplicate`` unless both sides hold the very same rows."""
    names = [c.name for c in shape.columns]
    mine_by, theirs_by = _by_key(source), _by_key(target)
    found: list[tuple[int, Difference]] = []
    for key_hash in sorted(mine_by.keys() | theirs_by.keys()):
        mine, theirs = mine_by.get(key_hash, []), theirs_by.get(key_hash, [])
        if Counter(mine) == Counter(theirs):
            continue
        key = key_of((mine or theirs)[0], shape)
        if len(mine) > 1 or len(theirs) > 1:
            difference = Difference("duplicate", key, (), target_behind,
                                    counts=(len(mine), len(theirs)))
        elif not theirs:
            difference = Difference("missing", key, (), target_behind)
        elif not mine:
            difference = Difference("extra", key, (), target_behind)
        else:
            columns = tuple(n for n, a, b in zip(names, mine[0], theirs[0], strict=True)
                            if a != b)
            difference = Difference("different", key, columns, target_behind)
        found.append((key_hash, difference))
    return found


def key_of(texts: RowTexts, shape: TableShape) -> dict[str, str | None]:
    """A row's key columns' canonical texts, by name."""
    position = {c.name: i for i, c in enumerate(shape.columns)}
    return {k: texts[position[k]] for k in shape.keys}


def keys_named(sides: Sequence[ChecksumSide], shape: TableShape, keys: frozenset[int],
               key_texts: Mapping[int, RowTexts] | None = None) -> list[dict[str, str | None]]:
    """The key texts of *keys*, read from the first side that holds each (keys no side
    holds any more are left out)."""
    if not keys:
        return []
    wanted = sorted(keys)
    named: dict[int, dict[str, str | None]] = {}
    for side in sides:
        for key_hash, texts in _rows_of_keys(side, shape, wanted, key_texts):
            named.setdefault(key_hash, key_of(texts, shape))
    return [named[k] for k in sorted(named)]
