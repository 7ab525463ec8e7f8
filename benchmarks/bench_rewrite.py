"""Benchmark: upkeep's rewrite of a merge-on-read file, its time and its peak memory.

A table of ``--files`` files of ``--rows`` rows each (``id`` bigint, ``amount`` bigint,
``name`` string and a ``body`` of ``--width`` random bytes, a row group per file as
delta-rs writes them), each with a deletion vector marking ``--deleted`` of its rows at
random, is rewritten without them by
:func:`tidemark.lake.vector_compaction.prepare_rewrite` (the slow half of upkeep's
rewrite; the files are then discarded, nothing committed), each run in a process of its
own. The baseline, in the same run and alternating with it: the same rows copied by
pyarrow alone, every file read whole, its deleted rows dropped, and written as one Parquet
file (what a rewrite that holds its rows costs at least). Per contender: the median
seconds and peak RSS over ``--runs`` runs, and the ratios to the baseline.

Usage: ``uv run --frozen python benchmarks/bench_rewrite.py [--files 2] [--rows 500000]
[--width 100] [--deleted 0.3] [--runs 3] [--dir /tmp]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake
from pyroaring import BitMap64

sys.path.insert(0, str(Path(__file__).parent))

from processes import run_measured

from tidemark.lake import delta_log
from tidemark.lake.deletion_vector import write_vectors
from tidemark.lake.merge_on_read import feature_actions

_REWRITE = """
import sys
from pathlib import Path
from tidemark.lake import delta_log
from tidemark.lake.vector_compaction import RewritePlan, prepare_rewrite
root = Path(sys.argv[1])
state = delta_log.read_log(root)
plan = RewritePlan.of(state, list(state.files.values()), {"reason": "benchmark"})
prepare_rewrite(root, plan).discard(root)
"""

_COPY = """
import sys
from pathlib import Path
from urllib.parse import unquote
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from tidemark.lake import delta_log
from tidemark.lake.deletion_vector import DeletionVector, read_vector
root = Path(sys.argv[1])
live = []
for add in delta_log.read_log(root).files.values():
    rows = pq.read_table(root / unquote(add["path"]))
    gone = read_vector(root, DeletionVector.from_json(add["deletionVector"])).to_array()
    keep = np.ones(len(rows), dtype=bool)
    keep[np.frombuffer(gone, dtype=np.uint64).astype(np.int64)] = False
    live.append(rows.filter(pa.array(keep)))
out = root / "_copy.parquet"
pq.write_table(pa.concat_tables(live), out)
out.unlink()
"""


def build(root: Path, files: int, rows: int, width: int, deleted: float) -> int:
    """The table; returns its data files' bytes."""
    rng = np.random.default_rng(7)
    for number in range(files):
        ids = np.arange(number * rows, (number + 1) * rows, dtype=np.int64)
        body = rng.integers(0, 256, rows * width, dtype=np.uint8).tobytes()
        offsets = pa.array(np.arange(0, (rows + 1) * width, width, dtype=np.int32))
        table = pa.table({
            "id": ids, "amount": ids * 3,
            "name": pa.array([f"name-{i % 1000}" for i in range(rows)]),
            "body": pa.BinaryArray.from_buffers(pa.binary(), rows,
                                                [None, offsets.buffers()[1],
                                                 pa.py_buffer(body)])})
        write_deltalake(os.fspath(root), table, mode="append",
                        target_file_size=1 << 40)
    state = delta_log.read_log(root)
    adds = list(state.files.values())
    bitmaps = [BitMap64(rng.choice(rows, int(rows * deleted), replace=False)
                        .astype(np.uint64)) for _ in adds]
    now = delta_log.now_ms()
    actions = []
    for add, vector in zip(adds, write_vectors(root, bitmaps), strict=True):
        removal, addition = delta_log.replace_file_actions(add, vector, now)
        actions += [removal, addition]
    delta_log.commit(root, state.version + 1, [*feature_actions(state), *actions])
    return sum(int(a["size"]) for a in adds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--width", type=int, default=100)
    parser.add_argument("--deleted", type=float, default=0.3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        root = Path(work) / "t"
        size = build(root, args.files, args.rows, args.width, args.deleted)
        print(f"{args.files} files of {args.rows:,} rows ({args.width}-byte bodies), "
              f"{size / 2**20:.1f} MiB of Parquet, {args.deleted:.0%} of rows deleted")
        times: dict[str, list[float]] = {"rewrite": [], "copy": []}
        peaks: dict[str, list[int]] = {"rewrite": [], "copy": []}
        for run in range(args.runs):
            order = ("rewrite", "copy") if run % 2 == 0 else ("copy", "rewrite")
            for name in order:
                code = _REWRITE if name == "rewrite" else _COPY
                seconds, peak, _ = run_measured([sys.executable, "-c", code,
                                                 os.fspath(root)])
                times[name].append(seconds)
                peaks[name].append(peak)
        for name in ("copy", "rewrite"):
            print(f"{name:8} median {statistics.median(times[name]):.2f} s "
                  f"(runs {', '.join(f'{t:.2f}' for t in times[name])}), peak RSS "
                  f"{statistics.median(peaks[name]) / 2**20:.0f} MiB")
        time_ratio = statistics.median(times["rewrite"]) / statistics.median(times["copy"])
        peak_ratio = statistics.median(peaks["rewrite"]) / statistics.median(peaks["copy"])
        print(f"rewrite / copy: time {time_ratio:.2f}x, peak RSS {peak_ratio:.2f}x")


if __name__ == "__main__":
    main()
