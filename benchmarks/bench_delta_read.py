"""Reading a Delta target's live rows: tidemark.lake.delta_read against delta-rs's
``DeltaTable.scan()`` (DataFusion), on a table without and with deletion vectors.

Usage: uv run --frozen python benchmarks/bench_delta_read.py [--rows 2000000] [--runs 5]

Builds a table of *rows* rows in 20 files (id, a string, a double), and a copy with the
deletionVectors feature whose every file has 1% of its rows deleted by a hand-committed
deletion vector. Each read runs *runs* times, the readers alternating; printed: the
median and range of the CPU seconds (user+sys of this process) and wall seconds, and the
rows returned. Reads: the whole table; 1,000 random keys (``id IN ...``).
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from dv_commit import DV, live_adds, put_dv
from tidemark.lake.delta_read import live_rows

FILES = 20


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _build(root: Path, rows: int) -> tuple[Path, Path]:
    per = rows // FILES
    plain, dv = root / "plain", root / "dv"
    for path, config in ((plain, None), (dv, DV)):
        for f in range(FILES):
            ids = pa.array(range(f * per, (f + 1) * per), pa.int64())
            batch = pa.table({"id": ids, "s": pc.cast(ids, pa.string()),
                              "v": pc.multiply(pc.cast(ids, pa.float64()), 0.5)})
            write_deltalake(str(path), batch, mode="append", configuration=config)
    rng = random.Random(37)
    for name in list(live_adds(dv)):
        put_dv(dv, name, rng.sample(range(per), per // 100))
    return plain, dv


def _measure(readers: dict[str, Callable[[], int]], runs: int) -> None:
    times: dict[str, list[tuple[float, float, int]]] = {name: [] for name in readers}
    for _ in range(runs):
        for name, read in readers.items():
            cpu, wall = _cpu(), time.perf_counter()
            rows = read()
            times[name].append((_cpu() - cpu, time.perf_counter() - wall, rows))
    for name, runs_of in times.items():
        cpus = [c for c, _, _ in runs_of]
        walls = [w for _, w, _ in runs_of]
        print(f"  {name:42} cpu {statistics.median(cpus):6.3f} s "
              f"[{min(cpus):.3f}-{max(cpus):.3f}]  wall {statistics.median(walls):6.3f} s "
              f"[{min(walls):.3f}-{max(walls):.3f}]  rows {runs_of[0][2]:,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        plain, dv = _build(Path(root), args.rows)
        keys = random.Random(1).sample(range(args.rows), 1000)
        where = pc.field("id").isin(pa.array(keys, pa.int64()))
        sql = f"id IN ({', '.join(map(str, keys))})"
        for label, path in (("without deletion vectors", plain), ("with deletion vectors", dv)):
            print(f"{args.rows:,} rows, {FILES} files, {label}: whole table")
            readers: dict[str, Callable[[], int]] = {
                "delta_read live_rows().to_table()":
                    lambda p=path: live_rows(DeltaTable(str(p))).to_table().num_rows,
                "DeltaTable.scan().read_all()":
                    lambda p=path: pa.table(DeltaTable(str(p)).scan().read_all()).num_rows,
            }
            if path == plain:
                readers["to_pyarrow_dataset().to_table()"] = \
                    lambda p=path: DeltaTable(str(p)).to_pyarrow_dataset().to_table().num_rows
            _measure(readers, args.runs)
            print(f"{args.rows:,} rows, {FILES} files, {label}: 1,000 random keys")
            _measure({
                "delta_read to_table(filter=id isin)":
                    lambda p=path: live_rows(DeltaTable(str(p))).to_table(
                        filter=where).num_rows,
                "DeltaTable.scan(predicate=id IN)":
                    lambda p=path: pa.table(DeltaTable(str(p)).scan(
                        predicate=sql).read_all()).num_rows,
            }, args.runs)


if __name__ == "__main__":
    main()
