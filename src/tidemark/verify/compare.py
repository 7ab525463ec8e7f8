"""Comparing two checksum sides of one table: bucket sums, splitting the differing
buckets that hold many rows, then the rows of the differing buckets field by field.

Only sums cross from the sides until a bucket differs, so an equal table of any size
costs two scans and a few kilobytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Final

from tidemark.row_checksum import BucketSums, ChecksumSide, RowTexts, TableShape
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


def bucket_count(rows: int) -> int:
    """A power of two near rows / :data:`ROWS_PER_BUCKET`, at most :data:`MAX_BUCKETS`."""
    wanted = max(1, rows // ROWS_PER_BUCKET)
    count = 1
    while count < wanted and count < MAX_BUCKETS:
        count *= 2
    return count


def key_modulus(buckets: int) -> int:
    """The buckets to fetch single keys by: four times as many as the table has rows
    (about :data:`ROWS_PER_BUCKET` per bucket of *buckets*), so that fetching the
    thousands of keys a writer changed during a round reads about as many rows, not the
    whole buckets they fall in."""
    return buckets * ROWS_PER_BUCKET * 4


@dataclasses.dataclass
class Comparison:
    """What one comparison of two sides found."""

    rows_compared: int = 0
    differences: list[Difference] = dataclasses.field(default_factory=list)


def _differing(source: BucketSums, target: BucketSums) -> list[int]:
    return sorted(b for b in source.keys() | target.keys() if source.get(b) != target.get(b))


def _largest(source: BucketSums, target: BucketSums, bucket: int) -> int:
    return max(s.rows for s in (source.get(bucket), target.get(bucket)) if s is not None)


def compare_tables(source: ChecksumSide, target: ChecksumSide, shape: TableShape,
                   buckets: int, *, excluded_keys: frozenset[int] = frozenset(),
                   target_behind: bool = False) -> Comparison:
    """Compare every row of both sides but those whose key hash is in *excluded_keys*."""
    source_sums = source.bucket_sums(shape, buckets, excluded_keys=excluded_keys)
    target_sums = target.bucket_sums(shape, buckets, excluded_keys=excluded_keys)
    result = Comparison(rows_compared=sum(s.rows for s in source_sums.values()))
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
        source_sums = source.bucket_sums(shape, modulus, only=parts,
                                         excluded_keys=excluded_keys)
        target_sums = target.bucket_sums(shape, modulus, only=parts,
                                         excluded_keys=excluded_keys)
        differing = _differing(source_sums, target_sums)
    else:
        if differing:
            fetch.append((modulus, differing))
    for fetch_modulus, fetch_buckets in fetch:
        result.differences += compare_rows(
            source.bucket_rows(shape, fetch_modulus, fetch_buckets,
                               excluded_keys=excluded_keys),
            target.bucket_rows(shape, fetch_modulus, fetch_buckets,
                               excluded_keys=excluded_keys),
            shape, target_behind=target_behind)
    return result


def compare_keys(source: ChecksumSide, target: ChecksumSide, shape: TableShape,
                 buckets: int, keys: Iterable[int], *,
                 target_behind: bool = False) -> Comparison:
    """Compare only the rows whose key hash is in *keys* (a later round's keys)."""
    wanted = frozenset(keys)
    if not wanted:
        return Comparison()
    modulus = key_modulus(buckets)
    only = sorted({k % modulus for k in wanted})
    source_rows = {k: v for k, v in source.bucket_rows(shape, modulus, only).items()
                   if k in wanted}
    target_rows = {k: v for k, v in target.bucket_rows(shape, modulus, only).items()
                   if k in wanted}
    return Comparison(len(source_rows), compare_rows(source_rows, target_rows, shape,
                                                     target_behind=target_behind))


def compare_rows(source: dict[int, RowTexts], target: dict[int, RowTexts],
                 shape: TableShape, *, target_behind: bool = False) -> list[Difference]:
    """The differences between two sides' rows of the same buckets, by key."""
    names = [c.name for c in shape.columns]
    differences = []
    for key_hash in sorted(source.keys() | target.keys()):
        mine, theirs = source.get(key_hash), target.get(key_hash)
        if mine == theirs:
            continue
        if theirs is None:
            assert mine is not None
            differences.append(Difference("missing", key_of(mine, shape), (),
                                          target_behind))
        elif mine is None:
            differences.append(Difference("extra", key_of(theirs, shape), (),
                                          target_behind))
        else:
            columns = tuple(n for n, a, b in zip(names, mine, theirs, strict=True) if a != b)
            differences.append(Difference("different", key_of(mine, shape), columns,
                                          target_behind))
    return sorted(differences, key=lambda d: (d.kind, sorted(d.key.items(), key=str)))


def key_of(texts: RowTexts, shape: TableShape) -> dict[str, str | None]:
    """A row's key columns' canonical texts, by name."""
    position = {c.name: i for i, c in enumerate(shape.columns)}
    return {k: texts[position[k]] for k in shape.keys}


def keys_named(sides: Sequence[ChecksumSide], shape: TableShape, buckets: int,
               keys: frozenset[int]) -> list[dict[str, str | None]]:
    """The key texts of *keys*, read from the first side that holds each (keys no side
    holds any more are left out)."""
    if not keys:
        return []
    modulus = key_modulus(buckets)
    only = sorted({k % modulus for k in keys})
    named: dict[int, dict[str, str | None]] = {}
    for side in sides:
        for key_hash, texts in side.bucket_rows(shape, modulus, only).items():
            if key_hash in keys and key_hash not in named:
                named[key_hash] = key_of(texts, shape)
    return [named[k] for k in sorted(named)]
