"""A merge-on-read rewrite holds a row group of its files at a time, not the files
(:mod:`tidemark.lake.rewrite_files`): proven in a process of its own, on wide rows that
do not compress, by the most Arrow memory it held and by its peak resident memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import convert_to_deltalake

from tidemark.lake import delta_log

_FILES = 4
_ROWS = 1_500  # a file: 1,500 rows of 32 KiB, 47 MiB, in row groups of 60 rows (2 MiB)
_WIDTH = 32 << 10

_REWRITE = """
import json, re, sys
from pathlib import Path
import pyarrow as pa
from tidemark.lake import delta_log, rewrite_files
from tidemark.lake.vector_compaction import RewritePlan, prepare_rewrite
def status(name):
    text = Path("/proc/self/status").read_text()
    return int(re.search(name + r":\\s+(\\d+) kB", text).group(1)) << 10
rewrite_files._GROUP_BYTES = 2 << 20
root = Path(sys.argv[1])
state = delta_log.read_log(root)
plan = RewritePlan.of(state, list(state.files.values()), {"reason": "test"})
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
before = status("VmRSS")
prepared = prepare_rewrite(root, plan)
print(json.dumps({"grew": status("VmHWM") - before,
                  "arrow": pa.default_memory_pool().max_memory(),
                  "added": prepared.added}))
"""


def _wide_table(root: Path) -> int:
    """A table of _FILES files of incompressible rows; returns its rows' bytes."""
    root.mkdir()
    total = 0
    for number in range(_FILES):
        rows = pa.table({
            "id": pa.array(range(number * _ROWS, (number + 1) * _ROWS), pa.int64()),
            "body": pa.array([os.urandom(_WIDTH) for _ in range(_ROWS)], pa.binary())})
        pq.write_table(rows, root / f"part-{number}.parquet", row_group_size=_ROWS // 25)
        total += rows.nbytes
    convert_to_deltalake(os.fspath(root))
    return total


def test_a_rewrite_of_wide_rows_holds_a_row_group_not_the_files(tmp_path: Path) -> None:
    root = tmp_path / "t"
    data = _wide_table(root)
    done = subprocess.run([sys.executable, "-c", _REWRITE, os.fspath(root)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    # Held whole (before), the 188 MiB of rows took 422 MiB of Arrow memory and the
    # process grew by 918 MiB. Read and written 2 MiB row groups at a time: 15 MiB of
    # Arrow memory, and the allocators keep some of what was freed (76 MiB).
    assert result["arrow"] < data // 8, \
        f"the rewrite held {result['arrow'] >> 20} MiB of Arrow memory at most for " \
        f"{data >> 20} MiB of rows read and written in 2 MiB row groups"
    assert result["grew"] < data * 2 // 3, \
        f"the rewrite's process grew by {result['grew'] >> 20} MiB for {data >> 20} MiB " \
        "of rows"
    ids: list[int] = []
    groups = 0
    for add in result["added"]:
        new = pq.ParquetFile(root / add["path"])
        ids += new.read(columns=["id"]).column("id").to_pylist()
        groups += new.metadata.num_row_groups
        assert json.loads(add["stats"])["numRecords"] == new.metadata.num_rows
    expected: list[int] = []
    for add in delta_log.read_log(root).files.values():  # the order the rewrite took
        expected += pq.read_table(root / add["path"], columns=["id"]).column("id").to_pylist()
    assert sorted(expected) == list(range(_FILES * _ROWS))
    assert ids == expected  # every row, in order
    assert groups >= data // (16 << 20)  # groups of 8 MiB, or a read batch more
    assert delta_log.read_log(root).version == 0  # written beside, in no version
