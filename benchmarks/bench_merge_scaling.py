"""Benchmark: does one batch's merge cost the batch, or the whole table?

One batch of ``--batch`` changes (60% inserts of new keys, 30% updates, 10% deletes)
applied with ``apply_changes`` (SCD1) to a target of ``--rows`` rows (default 1M and 10M;
the shared workload's 10-column layout), for updates and deletes that hit

* ``tail``: keys among the newest 100,000 (the common case: recent rows change), and
* ``uniform``: keys anywhere in the table.

Each target is laid out two ways, written fresh for every measurement:

* ``one file``: the whole table in one Parquet file: what continuous merges left behind
  before targets were sized (every merge rewrote it): the baseline;
* ``sized``: files of ``--file-mb`` (tidemark's ``upkeep.target_file_mb``, default 16),
  in key order, as compaction of an insert-ordered table keeps them.

Prints the merge time (median of ``--runs``) and the bytes the merge rewrote (files it
removed), and the ratio to the baseline of the same run.

Usage: ``uv run python benchmarks/bench_merge_scaling.py [--rows 1000000 --rows 10000000]
[--batch 10000] [--runs 3] [--file-mb 16]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).parent))

from bench_apply import TABLE

from tidemark.lake import ApplySpec, apply_changes
from tidemark.lake.change_rows import change_rows_schema

_TAIL = 100_000
_WRITE_ROWS = 250_000  # rows per write (several files, so compaction writes them all)


def _rows(ids: np.ndarray, label: str) -> pa.Table:
    """Rows of the 10-column table for *ids*."""
    n = len(ids)
    ids64 = pa.array(ids, pa.int64())
    return pa.table({
        "id": ids64, "c_int": pa.array((ids % 1000).astype(np.int32)),
        "c_bigint": pa.array(ids * 1_000_003, pa.int64()),
        "c_text": pc.binary_join_element_wise("row ", pc.cast(ids64, pa.string()), ""),
        "c_numeric": pa.array((ids % 100_000).astype(np.int32)).cast(pa.decimal128(10, 0))
                       .cast(pa.decimal128(12, 2)),
        "c_ts": pa.array(1_700_000_000_000_000 + ids * 1_000_000,
                         pa.timestamp("us", tz="UTC")),
        "c_bool": pa.array(ids % 2 == 0),
        "c_label": pa.array([label] * n, pa.string()),
        "c_double": pa.array(ids / 7.0),
        "c_date": pa.array((19_700 + ids % 365).astype(np.int32), pa.date32()),
    }, schema=TABLE)


def build_target(path: Path, rows: int, file_mb: int | None) -> None:
    """The table's rows 1..rows in key order: one file, or files of *file_mb*; both
    compacted (the same Parquet compression, zstd, as upkeep's compaction writes)."""
    size = (1 << 40) if file_mb is None else file_mb << 20
    DeltaTable.create(str(path), TABLE, configuration={"delta.targetFileSize": str(size)})
    for start in range(1, rows + 1, _WRITE_ROWS):
        ids = np.arange(start, min(rows, start + _WRITE_ROWS - 1) + 1)
        write_deltalake(str(path), _rows(ids, "old"), mode="append", target_file_size=size)
    DeltaTable(str(path)).optimize.compact(target_size=size)


def batch(rows: int, size: int, where: str, seed: int) -> pa.Table:
    """One batch: inserts of new keys, updates and deletes of existing ones."""
    rng = np.random.default_rng(seed)
    inserts = np.arange(rows + 1, rows + 1 + size * 6 // 10)
    low = max(1, rows - _TAIL) if where == "tail" else 1
    touched = rng.choice(np.arange(low, rows + 1), size - len(inserts), replace=False)
    updates, deletes = touched[: size * 3 // 10], touched[size * 3 // 10:]
    upserts = _rows(np.concatenate([inserts, updates]), "new")
    ops = ["c"] * len(inserts) + ["u"] * len(updates)
    gone = _rows(deletes, "old")
    data = pa.concat_tables([upserts, gone])
    n = len(data)
    meta = {
        "_op": pa.array(ops + ["d"] * len(deletes)),
        "_lsn": pa.array(np.arange(n) + 10_000_000_000, pa.int64()),
        "_commit_lsn": pa.array(np.full(n, 10_000_000_000 + n), pa.int64()),
        "_seq": pa.array(np.arange(1, n + 1), pa.int64()),
        "_commit_ts": pa.array(np.full(n, 1_800_000_000_000_000), pa.timestamp("us", tz="UTC")),
        "_txid": pa.array(np.full(n, 7), pa.int64()),
        "_unavailable": pa.array([[]] * n, pa.list_(pa.string())),
    }
    for name, column in meta.items():
        data = data.append_column(name, column)
    return data.cast(change_rows_schema(TABLE))


def measure(work: Path, rows: int, layout: int | None, changes: pa.Table) -> tuple[float, int]:
    """Seconds of one apply_changes and the bytes of the files it replaced."""
    path = work / "target"
    shutil.rmtree(path, ignore_errors=True)
    build_target(path, rows, layout)
    before = DeltaTable(str(path))
    sizes = dict(zip(pa.table(before.get_add_actions(flatten=True)).column("path").to_pylist(),
                     pa.table(before.get_add_actions(flatten=True)).column("size_bytes")
                     .to_pylist(), strict=True))
    started = time.perf_counter()
    apply_changes(path, changes, ApplySpec(keys=("id",)), app_id="bench", version=1)
    seconds = time.perf_counter() - started
    after = set(pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
                .column("path").to_pylist())
    rewritten = sum(size for file, size in sizes.items() if file not in after)
    shutil.rmtree(path, ignore_errors=True)
    return seconds, rewritten


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, action="append")
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--file-mb", type=int, default=16)
    args = parser.parse_args()
    sizes = args.rows or [1_000_000, 10_000_000]
    print(f"one batch of {args.batch:,} changes (60% inserts, 30% updates, 10% deletes) "
          f"into an SCD1 target; median of {args.runs} runs; layouts alternate")
    results: dict[tuple[str, int, str], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rows in sizes:
            for where in ("tail", "uniform"):
                samples: dict[str, list[tuple[float, int]]] = {"one file": [], "sized": []}
                for run in range(args.runs):
                    changes = batch(rows, args.batch, where, seed=run)
                    layouts = [("one file", None), ("sized", args.file_mb)]
                    for name, layout in layouts if run % 2 == 0 else layouts[::-1]:
                        samples[name].append(measure(Path(tmp), rows, layout, changes))
                for name, got in samples.items():
                    results[(where, rows, name)] = (statistics.median(s for s, _ in got),
                                                    statistics.median(b for _, b in got))
                base_s = results[(where, rows, "one file")][0]
                for name in samples:
                    seconds, rewritten = results[(where, rows, name)]
                    print(f"  {where:<8} {rows:>11,} rows  {name:<9} {seconds:6.2f} s "
                          f"merge, rewrote {rewritten / 2**20:7.1f} MiB "
                          f"({base_s / seconds:.1f}x faster than one file)")
    for where in ("tail", "uniform"):
        small, big = min(sizes), max(sizes)
        if small != big:
            ratio = results[(where, big, "sized")][0] / results[(where, small, "sized")][0]
            print(f"{where}: sized, {big:,} rows / {small:,} rows = {ratio:.2f}x the merge "
                  "time")


if __name__ == "__main__":
    main()
