"""Benchmark: offset stores holding thousands of keys (one per stream group of a log-table
capture), against the same stores holding ten.

Seed 002 warns that Kafka Connect's offsets topic is a log, scanned on every start, so a
connector with thousands of offsets starts ever slower. tidemark's stores are keyed: for
each store this measures, with 10 keys and with ``--keys`` keys already stored, the time
to open the store and load one key, to load every key (``load_many``: a log-table
reader's start), and to save the 100 keys that moved in one ``save_many`` (a flush);
medians of ``--runs``.

Usage: ``uv run python benchmarks/bench_offsets.py [--keys 10000] [--runs 5]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidemark.offsets.file import FileOffsetStore
from tidemark.offsets.layered import LayeredOffsetStore
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.offsets.postgres import PostgresOffsetStore
from tidemark.offsets.sqlite import SqliteOffsetStore
from tidemark.offsets.store import OffsetStore, load_offsets
from tidemark.testing.postgres import PostgresCluster


def _key(group: int) -> str:
    return f"shop/logtable/group-{group}"


def _close(store: OffsetStore) -> None:
    close = getattr(store, "close", None)
    if callable(close):
        close()


def _measure(opener: Callable[[], OffsetStore], keys: int, runs: int
             ) -> tuple[float, float, float]:
    """(open + one load, load of every key, save_many of 100) in ms, medians."""
    store = opener()
    store.save_many({_key(g): {"snapshot": f"{g}:{g}:", "n": g} for g in range(keys)})
    _close(store)
    starts, loads, saves = [], [], []
    for run in range(runs):
        started = time.perf_counter()
        store = opener()
        store.load(_key(keys // 2))
        starts.append(time.perf_counter() - started)
        started = time.perf_counter()
        found = load_offsets(store, [_key(g) for g in range(keys)])
        loads.append(time.perf_counter() - started)
        assert len(found) == keys
        moved = {_key((run * 100 + g) % keys): {"snapshot": "9:9:", "n": run} for g in range(100)}
        started = time.perf_counter()
        store.save_many(moved)
        saves.append(time.perf_counter() - started)
        _close(store)
    return (statistics.median(starts) * 1000, statistics.median(loads) * 1000,
            statistics.median(saves) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with PostgresCluster(durable=True) as cluster, tempfile.TemporaryDirectory() as tmp:
        print(f"server: PostgreSQL, {cluster.durability}")
        work = Path(tmp)
        results: dict[str, dict[int, tuple[float, float, float]]] = {}
        for keys in (10, args.keys):
            dsn = cluster.create_database(f"offsets_{keys}")
            memory = MemoryOffsetStore()
            stores: dict[str, Callable[[], Any]] = {
                "memory": lambda memory=memory: memory,
                "file": lambda k=keys: FileOffsetStore(work / f"offsets-{k}.json"),
                "sqlite": lambda k=keys: SqliteOffsetStore(work / f"offsets-{k}.db"),
                "postgres": lambda d=dsn: PostgresOffsetStore(d),
                "layered (sqlite over postgres)": lambda k=keys, d=dsn: LayeredOffsetStore(
                    SqliteOffsetStore(work / f"layered-{k}.db"), PostgresOffsetStore(d)),
            }
            for name, opener in stores.items():
                results.setdefault(name, {})[keys] = _measure(opener, keys, args.runs)
                print(f"  {name}, {keys:,} keys: done", file=sys.stderr)
        print(f"\n{'store':<32}{'keys':>8}{'open+load 1':>14}{'load all':>12}"
              f"{'save_many 100':>16}")
        for name, by_keys in results.items():
            for keys, (start, load_all, save) in by_keys.items():
                print(f"{name:<32}{keys:>8,}{start:>12.2f}ms{load_all:>10.1f}ms"
                      f"{save:>14.2f}ms")
            small, big = by_keys[10], by_keys[args.keys]
            print(f"{'':<32}{'ratio':>8}{big[0] / small[0]:>13.1f}x"
                  f"{'':>12}{big[2] / small[2]:>15.1f}x")


if __name__ == "__main__":
    main()
