"""Benchmark: ``tidemark run`` merging changes into a populated Delta table, at
``local[1]``, ``local[2]`` and on a two-worker Spark standalone cluster, in the same run.

A private PostgreSQL holds ``t10`` with ``--rows`` rows (default 1M), which one
``tidemark run`` loads into Delta by its snapshot. Then ``--batches`` (default 2) times
``--transactions`` transactions (default 3,000) of 100 changes are made, most of them
updates and deletes of keys spread over the whole table: per transaction 70 updates and
20 deletes of keys picked by a fixed hash of the transaction (so every run makes the
same changes; a key already deleted makes one change fewer) and 10 inserts of new keys.
This is what a running pipeline lives with, unlike a first load into an empty table.

Every contender starts from a copy of the loaded pipeline (its checkpoint and Delta
table) and reads the same changes from its own copy of the pipeline's slot, taken
before the changes were made, with ``tidemark run --available-now`` and
``maxChangesPerTrigger`` at 100 changes per transaction, so each batch holds about
``--transactions`` transactions (300,000 changes by default); ``--runs`` runs per
contender, alternating. Measured per run:

* **changes/s merged** per batch: the batch's change rows over its own time (from the
  batch lines at debug level: Spark's start and the query's end are left out). The
  *first* batch also waits for what a query's start leaves cold (the JVMs' code, the
  executors' first tasks); the *later* batches are what a running pipeline does;
* **the machine's busy cores** during the later batches (``/proc/stat``, every process
  on the machine, PostgreSQL included), and its CPU seconds per batch: on two cores a
  batch cannot take less than half of those;
* **driver RSS**: the peak of the Python driver, and of its JVM (which, in local mode,
  also runs the executors; on the cluster the executors run in the workers' JVMs);
* the Delta table compared with PostgreSQL, every column of every row, after each run.

The cluster is started from the pyspark wheel (``tidemark.testing.spark_cluster``): two
workers of one core each, on this machine's two cores (the same cores as ``local[2]``).

Usage: ``uv run python benchmarks/bench_populated_merge.py [--rows 1000000]
[--transactions 3000] [--batches 2] [--runs 2]``
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))

import workload
from bench_pipeline_snapshot import run_pipeline

from tidemark.pipeline.compare import compare
from tidemark.testing.postgres import PostgresCluster, sql_connection
from tidemark.testing.spark_cluster import SparkStandaloneCluster

_CHANGES = f"""
DO $$
DECLARE
    i integer;
BEGIN
    FOR i IN 0 .. {{transactions}} - 1 LOOP
        UPDATE t10 SET c_int = c_int + 1, c_label = 'updated ' || i
        WHERE id IN (SELECT (((i * 100 + k)::bigint * 2654435761) % {{rows}}) + 1
                     FROM generate_series(1, 70) AS k);
        DELETE FROM t10
        WHERE id IN (SELECT (((i * 100 + k)::bigint * 2654435761) % {{rows}}) + 1
                     FROM generate_series(71, 90) AS k);
        {workload.t10_insert("{rows} + i * 10 + 1", "{rows} + i * 10 + 10")};
        COMMIT;
    END LOOP;
END
$$
"""
_COLUMNS = ["id", "c_int", "c_bigint", "c_text", "c_numeric", "c_ts", "c_bool", "c_label",
            "c_double", "c_date"]
# Driver: "read 1.2 s, public.t10 0.8 s"; executors: "plan 0.01 s, executors 2.1 s".
_TOOK = re.compile(r"^(\S+ \S+) DEBUG tidemark\.pipeline\.\w+: batch (\d+) took ([\d.]+) s: "
                   r"(?:read|plan) ([\d.]+) s, (?:public\.t10|executors) ([\d.]+) s")
_APPLIED = re.compile(r"^batch (\d+): (.*?) \|")


@dataclass
class Batch:
    """One batch of a run, from its batch lines."""

    changes: int
    start: float  # time.time() of the batch's start
    end: float
    read: float  # driver apply: read; executor apply: plan
    merge: float  # driver apply: the merge; executor apply: the executors' stage
    cpu: float = 0.0  # the machine's busy CPU seconds over the batch

    @property
    def rate(self) -> float:
        return self.changes / (self.end - self.start)


class MachineCpu(threading.Thread):
    """The machine's busy CPU time (every process: Spark, PostgreSQL, the rest), sampled
    every 50 ms, so a batch's CPU seconds can be read off its window afterwards."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []  # (time.time(), busy CPU seconds)
        self.stop = threading.Event()

    @staticmethod
    def _busy() -> float:
        times = psutil.cpu_times()
        return sum(times) - times.idle - getattr(times, "iowait", 0.0)

    def run(self) -> None:
        while True:
            self.samples.append((time.time(), self._busy()))
            if self.stop.wait(0.05):
                return

    def between(self, start: float, end: float) -> float:
        """Busy CPU seconds from *start* to *end* (to the nearest samples)."""
        inside = [busy for at, busy in self.samples if start <= at <= end]
        if len(inside) < 2:
            return 0.0
        return inside[-1] - inside[0]


@dataclass
class Contender:
    name: str
    master: str
    conf: str = ""
    apply_on: str = "driver"
    first: list[float] = field(default_factory=list)  # changes/s of the first batch
    later: list[float] = field(default_factory=list)  # of each later batch
    cpu: list[float] = field(default_factory=list)  # CPU seconds per later batch
    busy: list[float] = field(default_factory=list)  # cores busy in later batches
    drivers: list[int] = field(default_factory=list)
    jvms: list[int] = field(default_factory=list)


def _pipeline_file(base: Path, dsn: str, slot: str, master: str, conf: str,
                   apply_on: str = "driver", per_batch: int | None = None) -> Path:
    file = base / "pipeline.toml"
    limit = f"maxChangesPerTrigger = {per_batch}\n" if per_batch else ""
    file.write_text(
        f'[source]\ndsn = "{dsn}"\nslot = "{slot}"\npublication = "bench"\n{limit}'
        f'[spark]\ncheckpoint = "chk"\nmaster = "{master}"\navailable_now = true\n'
        f'apply_on = "{apply_on}"\n'
        f'conf = {{ "spark.ui.enabled" = "false"{conf} }}\n'
        '[targets."public.t10"]\npath = "lake/t10"\nkeys = ["id"]\n')
    return file


def _batches(log: str) -> list[Batch]:
    """The batches that applied changes, in order, from the run's batch lines."""
    changes: dict[int, int] = {}
    batches = []
    for line in log.splitlines():
        applied = _APPLIED.match(line)
        if applied:
            changes[int(applied.group(1))] = sum(
                int(n.replace(",", "")) for n in re.findall(r"\+([\d,]+)", applied.group(2)))
        took = _TOOK.match(line)
        if took:
            end = dt.datetime.strptime(took.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            batches.append((int(took.group(2)), end - float(took.group(3)), end,
                            float(took.group(4)), float(took.group(5))))
    found = [Batch(changes.get(batch_id, 0), start, end, read, merge)
             for batch_id, start, end, read, merge in batches]
    found = [batch for batch in found if batch.changes]
    if not found:
        raise SystemExit("no batch timings in the run's output:\n" + log[-3000:])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--transactions", type=int, default=3000,
                        help="transactions per batch (100 changes each)")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    per_batch = args.transactions * 100
    with PostgresCluster(durable=True) as pg, tempfile.TemporaryDirectory() as tmp, \
            SparkStandaloneCluster(Path(tmp) / "spark", workers=2, cores=1,
                                   memory_mb=3072) as spark_cluster:
        print(f"server: PostgreSQL, {pg.durability}")
        work = Path(tmp)
        dsn = pg.create_database("bench")
        workload.fill_t10(dsn, args.rows, "CREATE PUBLICATION bench FOR TABLE t10")
        loaded = work / "loaded"
        loaded.mkdir()
        seconds, _, _ = run_pipeline(_pipeline_file(loaded, dsn, "load", "local[2]", ""))
        print(f"{args.rows:,} rows loaded into Delta by the snapshot in {seconds:.1f} s")
        cluster_conf = ', "spark.driver.host" = "127.0.0.1", "spark.executor.memory" = "2g"'
        contenders = [
            Contender("local[1], driver apply", "local[1]"),
            Contender("local[2], driver apply", "local[2]"),
            Contender("standalone, driver apply", spark_cluster.master_url, cluster_conf),
            Contender("local[1], executor apply", "local[1]", apply_on="executors"),
            Contender("local[2], executor apply", "local[2]", apply_on="executors"),
            Contender("standalone, executor apply", spark_cluster.master_url, cluster_conf,
                      apply_on="executors"),
        ]
        slots = {(c.name, run): f"c{i}_{run}" for i, c in enumerate(contenders)
                 for run in range(args.runs)}
        with contextlib.closing(sql_connection(dsn)) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                for slot in slots.values():
                    cur.execute("SELECT pg_copy_logical_replication_slot('load', %s)", (slot,))
                cur.execute(_CHANGES.format(transactions=args.transactions * args.batches,
                                            rows=args.rows))
        print(f"{args.transactions * args.batches:,} transactions of up to 100 changes (70 "
              "updates, 20 deletes spread over the table, 10 inserts), in batches of up to "
              f"{per_batch:,} changes; each contender from a copy of the loaded pipeline")
        cpu = MachineCpu()
        cpu.start()
        cores = psutil.cpu_count() or 1
        for run in range(args.runs):
            for contender in contenders if run % 2 == 0 else contenders[::-1]:
                base = work / f"{slots[(contender.name, run)]}"
                shutil.copytree(loaded, base)
                # The copy reads its own slot into its own table: it adopts the
                # loaded pipeline's checkpoint, which records the loading pipeline as
                # its owner and the loaded table as the one its batches wrote to.
                (base / "chk" / "tidemark-pipeline.json").unlink(missing_ok=True)
                written = base / "chk" / "tidemark-targets.json"
                if written.exists():
                    written.write_text(written.read_text(encoding="utf-8").replace(
                        str(loaded), str(base)), encoding="utf-8")
                file = _pipeline_file(base, dsn, slots[(contender.name, run)],
                                      contender.master, contender.conf, contender.apply_on,
                                      per_batch)
                seconds, peaks, log = run_pipeline(file, "--log-level", "debug")
                batches = _batches(log)
                source, lake = compare(dsn, "public.t10", str(base / "lake/t10"), _COLUMNS)
                if source != lake:
                    raise SystemExit(f"{contender.name}: Delta differs from PostgreSQL")
                # A last batch of a few leftover transactions is no batch of the workload.
                for batch in batches:
                    batch.cpu = cpu.between(batch.start, batch.end)
                later = [b for b in batches[1:] if b.changes >= per_batch // 2]
                contender.first.append(batches[0].rate)
                contender.later += [b.rate for b in later]
                contender.cpu += [b.cpu for b in later]
                contender.busy += [b.cpu / (b.end - b.start) for b in later]
                contender.drivers.append(peaks.driver)
                contender.jvms.append(peaks.jvm)
                steps = ("read", "merge") if contender.apply_on == "driver" else \
                    ("plan", "executors")
                described = "; ".join(
                    f"{b.changes:,} in {b.end - b.start:.2f} s = {b.rate:,.0f}/s ({steps[0]} "
                    f"{b.read:.2f} s, {steps[1]} {b.merge:.2f} s"
                    + (f", {b.cpu:.1f} CPU-s)" if i else ")")
                    for i, b in enumerate(batches))
                print(f"  {contender.name}: {described}"
                      f"{' (spilled)' if 'the executors write it to' in log else ''}; "
                      f"run {seconds:.1f} s wall, driver {peaks.driver / 2**20:.0f} MiB, "
                      f"its JVM {peaks.jvm / 2**20:.0f} MiB; Delta equals PostgreSQL")
                shutil.rmtree(base)
        cpu.stop.set()
        print(f"\nmedians of {args.runs} runs (first batch) and of the later batches "
              f"(machine: {cores} cores):")
        for group in (contenders[:3], contenders[3:]):
            for contender in group:
                later = "no later batch (--batches 1)"
                if contender.later:
                    later = (f"later {statistics.median(contender.later):>7,.0f}/s "
                             f"({statistics.median(contender.busy):.2f} of {cores} cores "
                             f"busy, {statistics.median(contender.cpu):.1f} CPU-s a batch)")
                print(f"  {contender.name:28s} first {statistics.median(contender.first):>7,.0f}"
                      f"/s, {later}, driver "
                      f"{statistics.median(contender.drivers) / 2**20:.0f} MiB, JVM "
                      f"{statistics.median(contender.jvms) / 2**20:.0f} MiB")
            if all(c.later for c in group):
                local1, local2, cluster = (statistics.median(c.later) for c in group)
                where = "the driver" if group[0].apply_on == "driver" else "the executors"
                print(f"  merged on {where}, later batches: local[2] / local[1] "
                      f"{local2 / local1:.2f}x, standalone / local[2] {cluster / local2:.2f}x")


if __name__ == "__main__":
    main()
