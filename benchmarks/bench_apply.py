"""Benchmark: ``apply_changes`` into Delta Lake (SCD1, SCD2) against a plain Delta append.

The shared workload's shape (``workload.py``: a 10-column table, transactions of 100
changes: 60 inserts, 30 updates and 10 deletes), built directly as change rows in Arrow
so that only the apply step is measured. By default the updates and deletes hit rows of
the same transaction (as ``workload.py`` does); ``--spread`` makes them hit rows of
earlier transactions, which makes the merge rewrite existing files.

Every contender runs in its own process (peak RSS from ``wait4``) on the same rows in
batches of ``--batch`` changes (whole transactions):

* ``append``: ``write_deltalake(mode="append")`` of each batch — the baseline;
* ``scd1`` / ``scd2``: ``apply_changes`` with ``stored_as_scd_type`` 1 / 2.

Peak RSS is the whole process's; "of which writing" is its growth after the change rows
were built (the same for every contender).

Usage: ``uv run python benchmarks/bench_apply.py [--transactions 3000] [--batch 10000]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from tidemark.lake import ApplySpec, apply_changes
from tidemark.lake.change_rows import change_rows_schema

TABLE = pa.schema([
    pa.field("id", pa.int64()), pa.field("c_int", pa.int32()),
    pa.field("c_bigint", pa.int64()), pa.field("c_text", pa.string()),
    pa.field("c_numeric", pa.decimal128(12, 2)),
    pa.field("c_ts", pa.timestamp("us", tz="UTC")), pa.field("c_bool", pa.bool_()),
    pa.field("c_label", pa.string()), pa.field("c_double", pa.float64()),
    pa.field("c_date", pa.date32()),
])
TXN = 100  # changes per transaction: 60 inserts, 30 updates, 10 deletes


def build_changes(transactions: int, spread: bool, seed: int = 7) -> pa.Table:
    """The workload's change rows, in commit order."""
    rng = np.random.default_rng(seed)
    t = np.arange(transactions)
    inserted = (t[:, None] * 60 + np.arange(1, 61)[None, :])  # ids inserted by txn t
    if spread:  # update/delete rows of any earlier transaction (or this one for txn 0)
        pool_hi = np.maximum(t, 1) * 60
        updated = rng.integers(1, pool_hi[:, None] + 1, size=(transactions, 30))
        deleted = rng.integers(1, pool_hi[:, None] + 1, size=(transactions, 10))
    else:
        updated = inserted[:, :30]
        deleted = inserted[:, 30:40]
    ids = np.concatenate([inserted, updated, deleted], axis=1).ravel()
    ops = np.tile(np.array(["c"] * 60 + ["u"] * 30 + ["d"] * 10), transactions)
    n = len(ids)
    seq = np.tile(np.arange(1, TXN + 1), transactions)
    commit = np.repeat((t + 1) * 1_000_000, TXN)
    is_update = ops == "u"
    live = ops != "d"
    numeric = [decimal.Decimal(int(g % 100000)).scaleb(-2) for g in ids]
    base_ts = dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp() * 1_000_000
    columns = {
        "id": pa.array(ids, pa.int64()),
        "c_int": pa.array(np.where(is_update, ids % 1000 + 1, ids % 1000), pa.int32()),
        "c_bigint": pa.array(ids * 1000003, pa.int64()),
        "c_text": pa.array(np.char.add("row ", np.char.zfill(ids.astype(str), 16))),
        "c_numeric": pa.array(numeric, pa.decimal128(12, 2)),
        "c_ts": pa.array(base_ts + ids * 1_000_000, pa.int64()).cast(
            pa.timestamp("us", tz="UTC")),
        "c_bool": pa.array(ids % 2 == 0),
        "c_label": pa.array(np.where(is_update, "updated",
                                     np.char.add("label-", (ids % 97).astype(str)))),
        "c_double": pa.array(np.where(is_update, ids / 7.0 * 2, ids / 7.0)),
        "c_date": pa.array(ids % 365, pa.int32()).cast(pa.date32()),
    }
    for name in list(columns)[1:]:  # a delete carries only the key (REPLICA IDENTITY DEFAULT)
        columns[name] = _null_where(columns[name], ~live)
    meta = {
        "_op": pa.array(ops), "_lsn": pa.array(commit - TXN + seq, pa.int64()),
        "_commit_lsn": pa.array(commit, pa.int64()), "_seq": pa.array(seq, pa.int64()),
        "_commit_ts": pa.array(base_ts + commit, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "_txid": pa.array(np.repeat(t + 1000, TXN), pa.int64()),
        "_unavailable": pa.array([[]] * n, pa.list_(pa.string())),
    }
    return pa.Table.from_pydict({**columns, **meta}, schema=change_rows_schema(TABLE))


def _null_where(array: pa.Array, mask: np.ndarray) -> pa.Array:
    return pc.if_else(pa.array(mask), pa.nulls(len(array), array.type), array)


def run_contender(name: str, changes: pa.Table, batch: int) -> dict[str, float]:
    """Apply *changes* in batches with one contender; returns timing figures."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t"
        spec = ApplySpec(keys=("id",), stored_as_scd_type=2 if name == "scd2" else 1)
        started = time.perf_counter()
        for version, offset in enumerate(range(0, len(changes), batch)):
            part = changes.slice(offset, batch)
            if name == "append":
                write_deltalake(path, part, mode="append")
            else:
                apply_changes(path, part, spec, app_id="bench", version=version)
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "changes": len(changes)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transactions", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--spread", action="store_true",
                        help="updates and deletes hit rows of earlier transactions")
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender:
        changes = build_changes(args.transactions, args.spread)
        built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({**run_contender(args.contender, changes, args.batch),
                          "rss_after_build": built}))
        return
    hits = "rows of earlier transactions" if args.spread else "rows of the same transaction"
    print(f"{args.transactions * TXN:,} changes in batches of {args.batch:,}, "
          f"updates/deletes hit {hits}")
    results: dict[str, tuple[float, int, int]] = {}
    for name in ("append", "scd1", "scd2"):
        argv = [sys.executable, __file__, "--contender", name, "--transactions",
                str(args.transactions), "--batch", str(args.batch)] + (
                    ["--spread"] if args.spread else [])
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
        assert proc.stdout is not None
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        if status:
            raise SystemExit(f"{name} failed with status {status}")
        figures = json.loads(out)
        peak = usage.ru_maxrss * 1024
        results[name] = (figures["changes"] / figures["seconds"], peak,
                         peak - figures["rss_after_build"])
    base = results["append"][0]
    print(f"{'contender':<34}{'changes/s':>12}{'vs append':>11}{'peak RSS':>11}"
          f"{'of which writing':>18}")
    labels = {"append": "write_deltalake append (baseline)", "scd1": "apply_changes SCD1",
              "scd2": "apply_changes SCD2"}
    for name, (rate, rss, growth) in results.items():
        print(f"{labels[name]:<34}{rate:>12,.0f}{rate / base:>10.2f}x{rss / 2**20:>8.0f} MB"
              f"{growth / 2**20:>15.0f} MB")


if __name__ == "__main__":
    main()
