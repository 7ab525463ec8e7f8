"""The key index's hash lookup: through adds, bucket splits, maintenance, rows moved and
renumbering, it finds exactly the live entries of each hash, as a plain dict does."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tidemark.lake import key_lookup
from tidemark.lake.key_hashes import key_hashes
from tidemark.lake.key_lookup import HashLookup


def _found(lookup: HashLookup, hashes: np.ndarray, alive: np.ndarray) -> set[tuple[int, int]]:
    probe, rows = lookup.find(hashes)
    live = alive[rows]
    return {(int(hashes[p]), int(r)) for p, r in zip(probe[live], rows[live], strict=True)}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bucket_max", [3, 64, 1 << 20])
def test_the_lookup_finds_what_a_dict_holds(seed: int, bucket_max: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(key_lookup, "_BUCKET_MAX", bucket_max)
    monkeypatch.setattr(key_lookup, "_CYCLE", 3)
    rng = np.random.default_rng(seed)
    lookup = HashLookup()
    alive = np.zeros(0, dtype=bool)
    model: dict[int, int] = {}  # row number -> hash, live rows only
    # A few hashes often, and extremes, so that equal hashes and bucket edges occur.
    pool = np.concatenate([rng.integers(0, 1 << 63, 40, dtype=np.uint64) * np.uint64(2),
                           np.asarray([0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1],
                                      dtype=np.uint64)])
    for _ in range(40):
        step = int(rng.integers(0, 4))
        if step == 0 or not model:  # new rows
            count = int(rng.integers(1, 30))
            numbers = np.arange(len(alive), len(alive) + count, dtype=np.int64)
            hashes = rng.choice(pool, count)
            alive = np.concatenate([alive, np.ones(count, dtype=bool)])
            lookup.add(hashes, numbers)
            model.update(zip(numbers.tolist(), hashes.tolist(), strict=True))
        elif step == 1:  # rows deleted
            gone = rng.choice(list(model), min(len(model), int(rng.integers(1, 10))),
                              replace=False)
            alive[gone] = False
            for row in gone.tolist():
                del model[row]
        elif step == 2:  # rows moved to new numbers (a rewrite), runs or scattered
            moved = np.sort(rng.choice(list(model), min(len(model), int(rng.integers(1, 12))),
                                       replace=False)).astype(np.int64)
            new = np.arange(len(alive), len(alive) + len(moved), dtype=np.int64)
            alive = np.concatenate([alive, np.ones(len(moved), dtype=bool)])
            alive[moved] = False
            lookup.repoint(moved, new)
            for old, row in zip(moved.tolist(), new.tolist(), strict=True):
                model[row] = model.pop(old)
        else:  # renumbered: the live rows packed in order
            live = np.flatnonzero(alive)
            to = np.full(len(alive), -1, dtype=np.int64)
            to[live] = np.arange(len(live))
            lookup.renumber(alive, lambda numbers, to=to: to[numbers])
            model = {int(to[row]): h for row, h in model.items()}
            alive = np.ones(len(live), dtype=bool)
        lookup.maintain(alive)
        wanted = {(h, row) for row, h in model.items()}
        assert _found(lookup, pool, alive) == wanted
        assert len(lookup) >= len(model)
    if bucket_max == 3:
        assert lookup.buckets > 1
    # Every bucket maintained: no entry of a dead row is left.
    for _ in range(lookup.buckets):
        lookup.maintain(alive)
    assert len(lookup) == len(model)


def test_integer_keys_spread_over_the_buckets() -> None:
    """Keys 1..n (the usual identity column) fill every bucket about evenly: their hashes
    place them by the top bits, which the keys themselves leave at zero (every entry in
    one bucket: a pass over the whole lookup at each of its maintenances)."""
    keys = pa.table({"id": pa.array(range(1, 200_001), pa.int64())})
    hashes, exact = key_hashes(keys)
    assert exact and len(np.unique(hashes)) == len(hashes)
    per_bucket = np.bincount((hashes >> np.uint64(57)).astype(np.int64), minlength=128)
    assert per_bucket.min() > 0.8 * len(hashes) / 128
    lookup = HashLookup()
    lookup.add(hashes, np.arange(len(hashes), dtype=np.int64))
    assert lookup.buckets > 1
    probe, rows = lookup.find(hashes[:1000])
    assert sorted(probe.tolist()) == list(range(1000)) and (rows == probe).all()
