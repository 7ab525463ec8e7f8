"""Benchmark: merge-on-read against copy-on-write, batch by batch, into 1M and 10M rows.

Issue 37's batch-level figures, at the ``apply_changes`` level (no database: the change
rows are built here). For each ``--rows`` size:

1. A target of that many rows (``id`` bigint key, ``name`` string, ``amount`` bigint,
   plus the sequence columns ``_commit_lsn``/``_seq`` the target keeps: ~45 bytes a row)
   is loaded as a pipeline's snapshot would be: ``load_in_steps(..., how="replace")`` in
   pieces of ``--piece`` rows, files of delta-rs's default target size. One copy per mode.
2. The same sequence of ``--batch``-change batches (60% inserts of new keys, 30% updates
   and 10% deletes of uniformly random live rows, sequence increasing) is applied to each
   copy with ``ApplySpec(keys=("id",), merge=mode)``, the modes alternating which goes
   first. Per batch: wall seconds, CPU seconds (rusage of this process: delta-rs's
   threads included) and the bytes of the files that appeared in the table directory
   (data and deletion-vector files; the ``_delta_log`` apart). The first batch is
   reported apart (merge-on-read builds its key index then; the build is also timed on
   its own, with the index's memory per million rows). One batch with ``merge="auto"``
   follows, to show what it picks.
3. After the merge-on-read batches, a full scan of that table
   (``tidemark.lake.delta_read.live_rows(...).to_table()`` and DuckDB's delta extension
   ``SELECT count(*), sum(id) FROM delta_scan(...)``) against a compacted copy
   (``DeltaTable.optimize.compact()``), alternating, ``--scans`` times each.

Every target is checked against a model of the changes at the end (count and sum of the
ids, and 2,000 sampled ids, live and deleted). With two sizes, the ratio of the median
batch time into the larger to the smaller is printed per mode (issue 37's target for
merge-on-read: at most 1.5x from 1M to 10M; a full scan at most 1.3x the compacted).

Usage: ``uv run --frozen python benchmarks/bench_merge_on_read.py [--rows 1000000
--rows 10000000] [--batches 20] [--cow-batches N] [--modes merge_on_read,copy_on_write]
[--scans 5] [--upkeep] [--dir /tmp]``
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import duckdb_extension_delta
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from tidemark.lake import ApplySpec, apply_changes
from tidemark.lake.change_rows import change_rows_schema
from tidemark.lake.delta_read import live_rows
from tidemark.lake.delta_writer import load_in_steps
from tidemark.lake.held_tables import HELD
from tidemark.lake.merge_on_read import TARGETS
from tidemark.lake.upkeep import UpkeepSettings, UpkeepState, upkeep

TABLE = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string()),
                   pa.field("amount", pa.int64())])
CHANGES = change_rows_schema(TABLE)
_TS = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
MODES = ("merge_on_read", "copy_on_write")
APP = "bench-mor"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _change_rows(ids: np.ndarray, amounts: np.ndarray, ops: list[str] | np.ndarray,
                 commit_lsn: int) -> pa.Table:
    """Change rows of *ids* (row values from the id and its amount), one transaction."""
    n = len(ids)
    id_array = pa.array(ids, pa.int64())
    return pa.table({
        "id": id_array,
        "name": pc.binary_join_element_wise("customer-", pc.cast(id_array, pa.string()), ""),
        "amount": pa.array(amounts, pa.int64()),
        "_op": pa.array(ops, pa.string()),
        "_lsn": pa.array(np.arange(n, dtype=np.int64) + commit_lsn * 1_000_000, pa.int64()),
        "_commit_lsn": pa.array(np.full(n, commit_lsn, dtype=np.int64)),
        "_seq": pa.array(np.arange(1, n + 1, dtype=np.int64)),
        "_commit_ts": pa.array(np.full(n, int(_TS.timestamp() * 1e6) + commit_lsn),
                               pa.timestamp("us", tz="UTC")),
        "_txid": pa.array(np.full(n, commit_lsn, dtype=np.int64)),
        "_unavailable": pa.array([[]] * n, pa.list_(pa.string())),
    }).cast(CHANGES)


class Model:
    """The rows the target should hold: ``amount[id]`` (-1 for no row) and the live ids
    in an array that deletes shrink by moving the last ids into the holes."""

    def __init__(self, rows: int, batches: int, batch: int) -> None:
        self.amount = np.full(rows + batches * batch + 1, -1, dtype=np.int64)
        self.amount[1:rows + 1] = 0
        self.live = np.arange(1, rows + 1, dtype=np.int64)
        self.next_id = rows + 1

    def batch(self, size: int, number: int, rng: np.random.Generator) -> pa.Table:
        """The next batch's change rows (applied to the model)."""
        inserts = np.arange(self.next_id, self.next_id + size * 6 // 10, dtype=np.int64)
        self.next_id += len(inserts)
        n_updates, n_deletes = size * 3 // 10, size - len(inserts) - size * 3 // 10
        at = rng.choice(len(self.live), n_updates + n_deletes, replace=False)
        updates, deletes = self.live[at[:n_updates]], self.live[at[n_updates:]]
        amount = number + 1
        self.amount[inserts] = amount
        self.amount[updates] = amount
        self.amount[deletes] = -1
        self._remove(at[n_updates:])
        self.live = np.concatenate([self.live, inserts])
        ids = np.concatenate([inserts, updates, deletes])
        amounts = np.concatenate([np.full(len(inserts) + len(updates), amount),
                                  self.amount[deletes].clip(0)])
        ops = ["c"] * len(inserts) + ["u"] * len(updates) + ["d"] * len(deletes)
        order = rng.permutation(len(ids))  # changes of one transaction, in random key order
        return _change_rows(ids[order], amounts[order], np.asarray(ops)[order],
                            commit_lsn=1_000 + number)

    def _remove(self, positions: np.ndarray) -> None:
        k, n = len(positions), len(self.live)
        gone = np.zeros(n, dtype=bool)
        gone[positions] = True
        holes = np.flatnonzero(gone[: n - k])
        fillers = np.flatnonzero(~gone[n - k:]) + (n - k)
        self.live[holes] = self.live[fillers]
        self.live = self.live[: n - k]


def snapshot_pieces(rows: int, piece: int) -> Iterator[pa.Table]:
    """The snapshot's change rows (op ``r``, amount 0), *piece* rows at a time."""
    for start in range(1, rows + 1, piece):
        ids = np.arange(start, min(rows, start + piece - 1) + 1, dtype=np.int64)
        yield _change_rows(ids, np.zeros(len(ids), dtype=np.int64), ["r"] * len(ids),
                           commit_lsn=1)


def _files(root: Path) -> dict[str, int]:
    """Sizes of the table directory's files, the log and tidemark's scratch apart."""
    found = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("_delta_log", "_tidemark_scratch")]
        for name in names:
            path = os.path.join(folder, name)
            found[path] = os.path.getsize(path)
    return found


@dataclass
class Run:
    """One mode's batches into one size."""

    path: Path
    spec: ApplySpec
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    written: list[int] = field(default_factory=list)
    picked: list[str] = field(default_factory=list)
    upkeep: UpkeepState | None = None
    """With ``--upkeep``: tidemark run's upkeep after each batch, as the pipeline runs it."""
    upkeep_wall: list[float] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    task_seconds: dict[str, list[float]] = field(default_factory=dict)

    def apply(self, changes: pa.Table, version: int) -> None:
        before = _files(self.path)
        cpu, wall = _cpu(), time.perf_counter()
        result = apply_changes(self.path, changes, self.spec, app_id=APP, version=version)
        self.wall.append(time.perf_counter() - wall)
        self.cpu.append(_cpu() - cpu)
        after = _files(self.path)
        self.written.append(sum(size for p, size in after.items() if p not in before))
        self.picked.append(result.merge)
        if self.upkeep is not None:
            started = time.perf_counter()
            # As tidemark run does: upkeep takes the table the batch left open.
            table = HELD.take(str(self.path), None) or DeltaTable(str(self.path))
            done = upkeep(table, UpkeepSettings(), self.upkeep, keys=self.spec.keys)
            HELD.give_back(str(self.path), None, table)
            self.upkeep_wall.append(time.perf_counter() - started)
            self.tasks += [task.name for task in done]
            for task in done:
                self.task_seconds.setdefault(task.name, []).append(task.seconds)


def _spread(values: list[float], fmt: str = "{:.3f}") -> str:
    if not values:
        return "-"
    return (f"{fmt.format(statistics.median(values))} "
            f"({fmt.format(min(values))}-{fmt.format(max(values))}, n={len(values)})")


def _mb(values: list[int]) -> list[float]:
    return [v / 1e6 for v in values]


def build(path: Path, rows: int, piece: int) -> float:
    """Load the snapshot into *path*; the seconds it took."""
    started = time.perf_counter()
    load_in_steps(path, snapshot_pieces(rows, piece), ApplySpec(keys=("id",)), app_id=APP,
                  version=0, how="replace")
    return time.perf_counter() - started


def index_build(path: Path, spec: ApplySpec) -> tuple[float, float, int, int]:
    """Wall and CPU seconds of building the key index of *path* from the table, its
    memory in bytes and its live rows; the index is forgotten again."""
    TARGETS.forget(path)
    cpu, wall = _cpu(), time.perf_counter()
    index, _ = TARGETS.current(path, spec)
    took = (time.perf_counter() - wall, _cpu() - cpu, index.memory_bytes(), index.live_rows())
    TARGETS.forget(path)
    return took


def check(path: Path, model: Model, rng: np.random.Generator) -> str:
    """Compare the table with the model (raises on a difference); a one-line summary."""
    ids = live_rows(DeltaTable(str(path))).to_table(columns=["id"]).column("id")
    want = model.amount >= 0
    count, total = len(ids), int(pc.sum(ids).as_py() or 0)
    want_count, want_sum = int(want.sum()), int(np.flatnonzero(want).sum())
    if (count, total) != (want_count, want_sum):
        raise AssertionError(f"{path}: {count} rows, sum(id) {total}; the model has "
                             f"{want_count}, {want_sum}")
    if len(np.unique(ids.to_numpy())) != count:
        raise AssertionError(f"{path}: a key is held twice")
    sample = np.unique(np.concatenate([rng.choice(model.live, 1_000),
                                       rng.integers(1, model.next_id, 1_000)]))
    got = live_rows(DeltaTable(str(path))).to_table(
        columns=["id", "name", "amount"], filter=pc.field("id").isin(pa.array(sample)))
    got_rows = {r["id"]: (r["name"], r["amount"]) for r in got.to_pylist()}
    for key in sample.tolist():
        expected = (f"customer-{key}", int(model.amount[key])) if model.amount[key] >= 0 \
            else None
        if got_rows.get(key) != expected:
            raise AssertionError(f"{path}: id {key} is {got_rows.get(key)}, the model "
                                 f"says {expected}")
    return f"{count:,} rows, sum(id) {total:,}, {len(sample):,} sampled ids: equal to the model"


def _delta_extension() -> str:
    found = sorted(Path(duckdb_extension_delta.__file__).parent.rglob("delta.duckdb_extension"))
    if not found:
        raise RuntimeError("duckdb-extension-delta ships no delta.duckdb_extension file")
    return str(found[0])


def scans(tables: dict[str, Path], runs: int) -> dict[tuple[str, str], list[float]]:
    """Wall seconds of the two full scans of each table, alternating."""
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    con.execute(f"LOAD '{_delta_extension()}'")
    out: dict[tuple[str, str], list[float]] = {}
    names = list(tables)
    for run in range(runs):
        for name in names if run % 2 == 0 else names[::-1]:
            path = tables[name]
            started = time.perf_counter()
            n = live_rows(DeltaTable(str(path))).to_table().num_rows
            out.setdefault((name, "live_rows"), []).append(time.perf_counter() - started)
            started = time.perf_counter()
            got = con.execute("SELECT count(*), sum(id) FROM delta_scan(?)",
                              [str(path)]).fetchone()
            out.setdefault((name, "duckdb"), []).append(time.perf_counter() - started)
            assert got is not None and got[0] == n, f"{path}: duckdb {got} vs {n} rows"
    con.close()
    return out


def bench_size(work: Path, rows: int, args: argparse.Namespace) -> dict[str, Run]:
    """All measurements for one target size; the runs by mode."""
    modes = args.modes
    counts = {m: (args.cow_batches if m == "copy_on_write" and args.cow_batches is not None
                  else args.batches) for m in modes}
    total = max(counts.values())
    base = work / f"base-{rows}"
    seconds = build(base, rows, args.piece)
    files = len(DeltaTable(str(base)).file_uris())
    size = sum(_files(base).values())
    print(f"\n== {rows:,} rows: loaded by load_in_steps(how='replace') in pieces of "
          f"{args.piece:,} in {seconds:.1f} s: {files} file(s), {size / 1e6:.1f} MB",
          flush=True)
    runs = {}
    for mode in modes:
        path = work / f"{mode}-{rows}"
        shutil.copytree(base, path)
        runs[mode] = Run(path, ApplySpec(keys=("id",), merge=mode),
                         upkeep=UpkeepState() if args.upkeep else None)
    shutil.rmtree(base)
    if "merge_on_read" in runs:
        mor = runs["merge_on_read"]
        wall, cpu, memory, live = index_build(mor.path, mor.spec)
        print(f"key index build (fresh table): {wall:.2f} s wall, {cpu:.2f} s CPU; "
              f"{memory / 1e6:.1f} MB for {live:,} live rows = "
              f"{memory / (live / 1e6) / 1e6:.1f} MB per million rows", flush=True)
    model = Model(rows, total + 1, args.batch)
    stopped: dict[str, Model] = {}  # the model where a mode's batches ended early
    rng = np.random.default_rng(37)
    for number in range(total):
        for mode in modes:
            if number == counts[mode]:
                stopped[mode] = copy.deepcopy(model)
        changes = model.batch(args.batch, number, rng)
        order = [m for m in modes if number < counts[m]]
        for mode in order if number % 2 == 0 else order[::-1]:
            runs[mode].apply(changes, number + 1)
        if number % 10 == 9 or number == total - 1:
            done = ", ".join(f"{m} {_spread(r.wall[1:], '{:.2f}')}" for m, r in runs.items())
            print(f"  after batch {number + 1}: median s {done}", flush=True)
    auto = model.batch(args.batch, total, rng)
    for mode, run in runs.items():
        if mode in stopped:
            continue
        auto_run = Run(run.path, ApplySpec(keys=("id",), merge="auto"))
        auto_run.apply(auto, total + 1)
        print(f"auto, one more batch into the {mode} table: picked {auto_run.picked[0]!r}, "
              f"{auto_run.wall[0]:.2f} s", flush=True)
    for mode, run in runs.items():
        print(f"{mode}: first batch {run.wall[0]:.2f} s wall, {run.cpu[0]:.2f} s CPU, "
              f"{run.written[0] / 1e6:.2f} MB; batches 2..{len(run.wall)}: "
              f"wall s {_spread(run.wall[1:])}, CPU s {_spread(run.cpu[1:])}, "
              f"MB written {_spread(_mb(run.written[1:]), '{:.2f}')}; "
              f"merge {sorted(set(run.picked))}")
    for mode, run in runs.items():
        if run.upkeep is not None:
            counts_by_task = {t: run.tasks.count(t) for t in sorted(set(run.tasks))}
            print(f"{mode}: upkeep after each batch, wall s {_spread(run.upkeep_wall)}; "
                  f"tasks run {counts_by_task}")
            whole = sorted(w + u for w, u in zip(run.wall[1:], run.upkeep_wall[1:],
                                                 strict=True))
            print(f"{mode}: batch and its upkeep, wall s: median "
                  f"{statistics.median(whole):.3f}, p99 {whole[int(len(whole) * 0.99)]:.3f}, "
                  f"max {whole[-1]:.3f}; over 0.5 s: {sum(w > 0.5 for w in whole)} of "
                  f"{len(whole)}")
            print(f"{mode}: upkeep tasks, wall s: " + "; ".join(
                f"{name} {_spread(seconds)}" for name, seconds in
                sorted(run.task_seconds.items())))
    for mode, run in runs.items():
        if len(run.wall) > 21:  # merge-on-read's cost follows the files its batches add
            print(f"{mode}: wall s of batches 2..11 {_spread(run.wall[1:11])}, of the last "
                  f"10 {_spread(run.wall[-10:])}; CPU s {_spread(run.cpu[1:11])} and "
                  f"{_spread(run.cpu[-10:])}")
    for mode, run in runs.items():
        print(f"check {mode}: {check(run.path, stopped.get(mode, model), rng)}",
              flush=True)
    if "merge_on_read" in runs:
        mor = runs["merge_on_read"]
        wall, cpu, memory, live = index_build(mor.path, mor.spec)
        print(f"key index rebuild after {len(mor.wall)} batches: {wall:.2f} s wall, "
              f"{cpu:.2f} s CPU; {memory / 1e6:.1f} MB for {live:,} live rows = "
              f"{memory / (live / 1e6) / 1e6:.1f} MB per million rows")
        compacted = work / f"compacted-{rows}"
        shutil.copytree(mor.path, compacted)
        metrics = DeltaTable(str(compacted)).optimize.compact()
        print(f"compacted copy: {metrics.get('numFilesRemoved')} files -> "
              f"{metrics.get('numFilesAdded')}; merge-on-read table "
              f"{len(DeltaTable(str(mor.path)).file_uris())} files")
        print(f"check compacted: {check(compacted, model, rng)}")
        got = scans({"merge_on_read": mor.path, "compacted": compacted}, args.scans)
        for reader in ("live_rows", "duckdb"):
            a, b = got[("merge_on_read", reader)], got[("compacted", reader)]
            print(f"full scan by {reader}: after {len(mor.wall)} merge-on-read batches "
                  f"{_spread(a)} s, compacted {_spread(b)} s: "
                  f"{statistics.median(a) / statistics.median(b):.2f}x")
        shutil.rmtree(compacted)
    for run in runs.values():
        shutil.rmtree(run.path)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, action="append")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--cow-batches", type=int, default=None,
                        help="copy-on-write batches (default: --batches); at most --batches")
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--piece", type=int, default=1_000_000)
    parser.add_argument("--scans", type=int, default=5)
    parser.add_argument("--upkeep", action="store_true",
                        help="run tidemark run's upkeep (default settings) after each batch, "
                             "as the pipeline does: compaction, checkpoints, vacuum")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    args.modes = tuple(m for m in args.modes.split(",") if m)
    if not set(args.modes) <= set(MODES):
        parser.error(f"--modes: each of {', '.join(MODES)}")
    if args.cow_batches is not None and args.cow_batches > args.batches:
        parser.error("--cow-batches is at most --batches")
    sizes = args.rows or [1_000_000, 10_000_000]
    print(f"batches of {args.batch:,} changes (60% inserts, 30% updates, 10% deletes of "
          f"uniformly random live rows) into an SCD1 target; modes alternate; "
          f"medians (min-max)")
    results = {}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-mor-") as tmp:
        for rows in sizes:
            results[rows] = bench_size(Path(tmp), rows, args)
    if len(sizes) >= 2:
        small, large = min(sizes), max(sizes)
        for mode in args.modes:
            a, b = results[small][mode], results[large][mode]
            common = min(len(a.wall), len(b.wall))
            for window in sorted({21, common}):
                if window > common or window < 3:
                    continue
                ratio = [statistics.median(getattr(b, k)[1:window])
                         / statistics.median(getattr(a, k)[1:window]) for k in ("wall", "cpu")]
                print(f"{mode}: median of batches 2..{window} into {large:,} / into "
                      f"{small:,}: wall {ratio[0]:.2f}x, CPU {ratio[1]:.2f}x")

if __name__ == "__main__":
    sys.exit(main())
