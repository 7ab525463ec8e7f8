"""Benchmark: ``tidemark verify`` of a 10M-row table while 10,000 changes/s run, against
``COPY`` of the same table.

A private PostgreSQL (production durability) holds ``t10`` (the shared 10-column layout)
with ``--rows`` rows (default 10,000,000), loaded into Delta by ``tidemark run``
(continuous, ``trigger_interval_ms = 500``, ``local[2]``). Once the target holds the
table, a writer makes ``--rate`` changes/s (default 10,000) in transactions of 100: 60
inserts of new keys, 30 updates and 10 deletes of keys among the newest 100,000
(``soak_pipeline.Writer``, keys ``tail``). Uniform keys would make every copy-on-write
merge rewrite the whole 10M-row table (issue 37), so the pipeline could not keep up and
verify would only measure its wait for the pipeline.

Then, alternating the order every run, ``--runs`` times (default 3):

* (a) ``psql -c 'COPY t10 TO STDOUT'`` to /dev/null — the baseline;
* (b) ``tidemark verify pipeline.toml --json`` (wall time of the command; it must exit 0:
  the table is equal, a difference fails the benchmark);

printing rows/s of both (median, spread), their ratio and verify's own phases (from its
JSON: snapshot, wait for the pipeline, target open, changed keys, source sums, target
sums, rows fetched, rounds). Then (c): 10 rows of the Delta target are changed behind the
pipeline's back, on old keys the writer never touches (3 deleted, 4 updated, 3 appended
under keys the source never had), and verify is timed again: it must exit 1 naming
exactly those 10 keys; its time and the extra over (b)'s median are printed. The 10 rows
are then put back, the writer stopped, and the final check printed: the Delta table's
row count equals the source's and a last verify exits 0.

The load average is printed with the figures (the machine is shared).

``--merge`` sets the target's merge mode (default ``copy_on_write``): the pipeline's own
merges share the machine's two cores with verify, and a copy-on-write merge of the
newest keys rewrites the newest file every batch. The cores the writer, the server and
the pipeline keep busy before the runs are printed.

Usage: ``uv run python benchmarks/bench_verify.py [--rows 10000000] [--rate 10000]
[--runs 3] [--merge copy_on_write|merge_on_read|auto]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).parent))

import workload
from soak_pipeline import Writer

from tidemark.lake.delta_read import live_rows
from tidemark.testing.postgres import PostgresCluster, sql_connection

_MISSING = (101, 202, 303)
_DIFFERENT = (404, 505, 606, 707)
_EXTRA_FROM = (808, 909, 1010)  # appended as -808, -909, -1010: keys the source never had


@dataclass
class VerifyRun:
    seconds: float
    code: int
    report: dict[str, Any]
    load: float


def _load() -> float:
    return os.getloadavg()[0]


def copy(cluster: PostgresCluster, dbname: str) -> tuple[float, float]:
    """Wall seconds of ``COPY t10 TO STDOUT`` to /dev/null, and the load average."""
    psql = [str(Path(cluster.bindir) / "psql"), "-X", "-q", "-h", cluster.host,
            "-p", str(cluster.port), "-U", cluster.superuser, "-d", dbname,
            "-c", "COPY t10 TO STDOUT"]
    env = {**os.environ, "PGPASSWORD": cluster.password}
    load = _load()
    started = time.perf_counter()
    subprocess.run(psql, env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started, load


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot (/proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def busy_cores(seconds: float) -> float:
    """How many cores the machine kept busy over the next *seconds* (measured)."""
    busy0, total0 = _cpu_times()
    time.sleep(seconds)  # the interval measured
    busy1, total1 = _cpu_times()
    return (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1)


def verify(file: Path) -> VerifyRun:
    """``tidemark verify FILE --json``: wall seconds, exit code, its report."""
    load = _load()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tidemark", "verify", str(file), "--json"],
                          check=False, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    try:
        report = json.loads(done.stdout)
    except ValueError:
        raise SystemExit(f"verify exited {done.returncode} without a JSON report:\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}") from None
    return VerifyRun(seconds, done.returncode, report, load)


def _table(run: VerifyRun) -> dict[str, Any]:
    tables = run.report.get("tables") or []
    if len(tables) != 1:
        raise SystemExit(f"verify reported {len(tables)} tables: {run.report}")
    return dict(tables[0])


def phases_text(run: VerifyRun) -> str:
    """Verify's phases as it measured them (its JSON report)."""
    table = _table(run)
    phases = {**run.report.get("phases", {}), **table.get("phases", {})}
    parts = [f"{name} {seconds:.1f} s" for name, seconds in phases.items()]
    return (f"{', '.join(parts)}; {table['rows_compared']:,} rows compared, "
            f"{table['rows_fetched']:,} rows fetched, {table['rounds']} round(s), "
            f"Delta version {table['target_version']}")


def _spread(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f} s"


def _retry(change: Any) -> None:
    """Run a Delta change, again if the pipeline's merge committed in between."""
    for attempt in range(10):
        try:
            change()
            return
        except Exception as err:  # deltalake's CommitFailedError and kin
            if attempt == 9:
                raise
            print(f"  (Delta change retried: {type(err).__name__})")


class Drift:
    """10 rows of the target changed behind the pipeline's back, and put back."""

    def __init__(self, lake: Path) -> None:
        self.lake = str(lake)
        ids = [*_MISSING, *_DIFFERENT, *_EXTRA_FROM]
        self.saved = live_rows(DeltaTable(self.lake)).to_table(
            filter=pc.field("id").isin(ids))
        if self.saved.num_rows != len(ids):
            raise SystemExit(f"the target holds {self.saved.num_rows} of the rows {ids}")
        self.keys = {("missing", i) for i in _MISSING} | \
            {("different", i) for i in _DIFFERENT} | {("extra", -i) for i in _EXTRA_FROM}

    def apply(self) -> None:
        _retry(lambda: DeltaTable(self.lake).delete(f"id IN {_MISSING}"))
        _retry(lambda: DeltaTable(self.lake).update({"c_label": "'drifted'"},
                                                    predicate=f"id IN {_DIFFERENT}"))
        extra = self.saved.filter(pc.field("id").isin(_EXTRA_FROM))
        extra = extra.set_column(extra.schema.get_field_index("id"), "id",
                                 pc.negate(extra.column("id")))
        _retry(lambda: write_deltalake(self.lake, extra, mode="append"))

    def undo(self) -> None:
        changed = tuple([*_MISSING, *_DIFFERENT, *(-i for i in _EXTRA_FROM)])
        _retry(lambda: DeltaTable(self.lake).delete(f"id IN {changed}"))
        back = self.saved.filter(pc.field("id").isin([*_MISSING, *_DIFFERENT]))
        _retry(lambda: write_deltalake(self.lake, back, mode="append"))

    def found(self, run: VerifyRun) -> set[tuple[str, int]]:
        return {(d["kind"], int(d["key"]["id"])) for d in _table(run)["differences"]}


def caught_up(dsn: str, lake: Path, check_alive: Any) -> tuple[int, int]:
    """With the writer stopped: the source's and the target's row counts once equal
    (or after 600 s)."""
    with sql_connection(dsn, autocommit=True) as conn:
        source_rows = int(conn.execute("SELECT count(*) FROM t10").fetchone()[0])
    deadline = time.monotonic() + 600
    while (delta_rows := live_rows(DeltaTable(str(lake))).count_rows()) \
            != source_rows and time.monotonic() < deadline:
        check_alive()
        time.sleep(0.5)  # polling the pipeline's catching up
    return source_rows, delta_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--merge", default="copy_on_write",
                        choices=("copy_on_write", "merge_on_read", "auto"),
                        help="the target's merge mode (the pipeline's own cost)")
    args = parser.parse_args()
    with PostgresCluster(durable=True) as cluster, tempfile.TemporaryDirectory() as tmp:
        print(f"server: PostgreSQL, {cluster.durability}")
        dbname = "verify"
        dsn = cluster.create_database(dbname)
        started = time.perf_counter()
        workload.fill_t10(dsn, args.rows)
        print(f"t10 filled with {args.rows:,} rows in {time.perf_counter() - started:.0f} s")
        work = Path(tmp)
        lake = work / "lake/t10"
        file = work / "pipeline.toml"
        file.write_text(
            f'[source]\ndsn = "{dsn}"\nslot = "verify"\npublication = "verify"\n'
            f'[spark]\nmaster = "local[2]"\ncheckpoint = "{work / "chk"}"\n'
            'trigger_interval_ms = 500\nconf = { "spark.ui.enabled" = "false" }\n'
            f'[targets."public.t10"]\npath = "{lake}"\nkeys = ["id"]\n'
            f'merge = "{args.merge}"\n')
        log = work / "run.log"
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "tidemark", "run", str(file)],
                                    env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        writer: Writer | None = None
        try:
            started = time.perf_counter()
            deadline = time.monotonic() + 3600
            while not DeltaTable.is_deltatable(str(lake)) or \
                    live_rows(DeltaTable(str(lake))).count_rows() < args.rows:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the snapshot did not finish:\n{log.read_text()[-3000:]}")
                time.sleep(1)  # polling the snapshot's progress
            print(f"loaded into Delta by tidemark run in {time.perf_counter() - started:.0f} s")
            writer = Writer(dsn, args.rows + 1, args.rate, "tail")
            writer.start()
            writing_since = time.perf_counter()
            print(f"writer: {args.rate:,} changes/s asked, transactions of 100, tail keys; "
                  f"target merge = {args.merge}")
            time.sleep(5)  # the writer and the pipeline settle before the CPU is measured
            print(f"  before the runs, the writer, the server and the pipeline keep "
                  f"{busy_cores(10.0):.2f} of the machine's {os.cpu_count()} cores busy")

            def check_alive() -> None:
                if proc.poll() is not None:
                    raise SystemExit(f"tidemark run stopped:\n{log.read_text()[-3000:]}")
                if writer is not None and writer.error is not None:
                    raise SystemExit(f"the writer failed: {writer.error}")

            copies: list[tuple[float, float]] = []
            verifies: list[VerifyRun] = []
            for run in range(args.runs):
                for contender in ("copy", "verify") if run % 2 == 0 else ("verify", "copy"):
                    check_alive()
                    if contender == "copy":
                        copies.append(copy(cluster, dbname))
                    else:
                        done = verify(file)
                        if done.code != 0:
                            raise SystemExit(f"verify of the equal table exited {done.code}:"
                                             f"\n{json.dumps(done.report, indent=1)[:3000]}")
                        verifies.append(done)
            check_alive()
            achieved = writer.changes / (time.perf_counter() - writing_since)
            copy_s = statistics.median(s for s, _ in copies)
            verify_s = statistics.median(v.seconds for v in verifies)
            print(f"\n{args.rows:,} rows of t10, writer at {achieved:,.0f} changes/s "
                  f"achieved; median of {args.runs} alternating runs (spread)")
            print(f"  (a) COPY t10 TO STDOUT   {args.rows / copy_s:>12,.0f} rows/s "
                  f"({copy_s:.1f} s, {_spread([s for s, _ in copies])}; load "
                  f"{', '.join(f'{load:.1f}' for _, load in copies)})")
            print(f"  (b) tidemark verify      {args.rows / verify_s:>12,.0f} rows/s "
                  f"({verify_s:.1f} s, {_spread([v.seconds for v in verifies])}; load "
                  f"{', '.join(f'{v.load:.1f}' for v in verifies)}); "
                  f"{verify_s / copy_s:.2f}x COPY's time")
            for i, done in enumerate(verifies, 1):
                print(f"      run {i}: {done.seconds:.1f} s: {phases_text(done)}")

            # The writer pauses while the target is changed behind the pipeline's back:
            # a Delta commit racing the pipeline's merge on the same files fails the
            # pipeline (delta-rs's conflict check), which is not what is measured here.
            writer.stop.set()
            writer.join()
            source_rows, delta_rows = caught_up(dsn, lake, check_alive)
            drift = Drift(lake)
            drift.apply()
            writer = Writer(dsn, writer.next_id, args.rate, "tail")
            writer.start()
            drifted = verify(file)
            found = drift.found(drifted)
            print(f"  (c) verify, 10 rows changed in Delta: {drifted.seconds:.1f} s "
                  f"(+{drifted.seconds - verify_s:.1f} s over (b)'s median; load "
                  f"{drifted.load:.1f}), exit {drifted.code}, {len(found)} keys named")
            print(f"      {phases_text(drifted)}")
            if drifted.code != 1 or found != drift.keys:
                behind = _table(drifted)["target_behind"]
                raise SystemExit(
                    f"verify should have named exactly {sorted(drift.keys)}; it exited "
                    f"{drifted.code} naming {len(found)} keys, {sorted(found)[:20]}..."
                    + (" (the pipeline had not caught up: target behind)" if behind else ""))
            writer.stop.set()
            writer.join()
            caught_up(dsn, lake, check_alive)
            drift.undo()
            check_alive()
            source_rows, delta_rows = caught_up(dsn, lake, check_alive)
            final = verify(file)
            print(f"final check, writer stopped: source {source_rows:,} rows, Delta "
                  f"{delta_rows:,} rows; verify exit {final.code} in {final.seconds:.1f} s "
                  f"({_table(final)['rows_compared']:,} rows compared)")
            if delta_rows != source_rows or final.code != 0:
                raise SystemExit("the Delta table does not equal the source: "
                                 f"{json.dumps(final.report, indent=1)[:3000]}")
        finally:
            if writer is not None:
                writer.stop.set()
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)


if __name__ == "__main__":
    main()
