"""Benchmark: ``tidemark run`` merging changes into a populated Delta table, at
``local[1]``, ``local[2]`` and on a two-worker Spark standalone cluster, in the same run.

A private PostgreSQL holds ``t10`` with ``--rows`` rows (default 1M), which one
``tidemark run`` loads into Delta by its snapshot. Then ``--transactions`` transactions
(default 3,000) of 100 changes are made, most of them updates and deletes of keys spread
over the whole table: per transaction 70 updates and 20 deletes of keys picked by a
fixed hash of the transaction (so every run makes the same changes; a key already
deleted makes one change fewer) and 10 inserts of new keys. This is what a running
pipeline lives with, unlike a first load into an empty table.

Every contender starts from a copy of the loaded pipeline (its checkpoint and Delta
table) and reads the same changes from its own copy of the pipeline's slot, taken
before the changes were made, with ``tidemark run --available-now``; ``--runs`` runs per
contender, alternating. Measured per run:

* **changes/s merged**: the change rows the batch lines report, over the time from the
  first batch's start to the last batch's end (the batches' own timing, at debug level:
  Spark's start and the query's end are left out), and the wall time of the whole run;
* **driver RSS**: the peak of the Python driver, and of its JVM (which, in local mode,
  also runs the executors; on the cluster the executors run in the workers' JVMs);
* the Delta table compared with PostgreSQL, every column of every row, after each run.

The cluster is started from the pyspark wheel (``tidemark.testing.spark_cluster``): two
workers of one core each, on this machine's two cores (the same cores as ``local[2]``).

Usage: ``uv run python benchmarks/bench_populated_merge.py [--rows 1000000]
[--transactions 3000] [--runs 2]``
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
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2

sys.path.insert(0, str(Path(__file__).parent))

import workload
from bench_pipeline_snapshot import run_pipeline

from tidemark.pipeline.compare import compare
from tidemark.testing.postgres import PostgresCluster
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
_TOOK = re.compile(r"^(\S+ \S+) DEBUG tidemark\.pipeline\.runner: batch \d+ took ([\d.]+) s: "
                   r"(?:read|plan) ([\d.]+) s, (?:public\.t10|executors) ([\d.]+) s")
_APPLIED = re.compile(r"^batch \d+: (.*?) \|")


@dataclass
class Contender:
    name: str
    master: str
    conf: str = ""
    apply_on: str = "driver"
    rates: list[float] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    drivers: list[int] = field(default_factory=list)
    jvms: list[int] = field(default_factory=list)


def _pipeline_file(base: Path, dsn: str, slot: str, master: str, conf: str,
                   apply_on: str = "driver") -> Path:
    file = base / "pipeline.toml"
    file.write_text(
        f'[source]\ndsn = "{dsn}"\nslot = "{slot}"\npublication = "bench"\n'
        f'[spark]\ncheckpoint = "chk"\nmaster = "{master}"\navailable_now = true\n'
        f'apply_on = "{apply_on}"\n'
        f'conf = {{ "spark.ui.enabled" = "false"{conf} }}\n'
        '[targets."public.t10"]\npath = "lake/t10"\nkeys = ["id"]\n')
    return file


def _batch_window(log: str) -> tuple[int, float, float, float]:
    """The change rows applied, the seconds from the first batch's start to the last
    batch's end, and of those the seconds reading the batches (Spark: decoding on the
    executors, bringing the rows to the driver) and merging them (delta-rs, on the
    driver), from the run's batch lines."""
    changes, spans, read, merge = 0, [], 0.0, 0.0
    for line in log.splitlines():
        applied = _APPLIED.match(line)
        if applied:
            changes += sum(int(n.replace(",", "")) for n in re.findall(r"\+([\d,]+)",
                                                                        applied.group(1)))
        took = _TOOK.match(line)
        if took:
            end = dt.datetime.strptime(took.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            spans.append((end - float(took.group(2)), end))
            read += float(took.group(3))
            merge += float(took.group(4))
    if not spans:
        raise SystemExit("no batch timings in the run's output:\n" + log[-3000:])
    return changes, spans[-1][1] - spans[0][0], read, merge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--transactions", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    with PostgresCluster() as pg, tempfile.TemporaryDirectory() as tmp, \
            SparkStandaloneCluster(Path(tmp) / "spark", workers=2, cores=1,
                                   memory_mb=3072) as spark_cluster:
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
        with contextlib.closing(psycopg2.connect(dsn)) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                for slot in slots.values():
                    cur.execute("SELECT pg_copy_logical_replication_slot('load', %s)", (slot,))
                cur.execute(_CHANGES.format(transactions=args.transactions, rows=args.rows))
        print(f"{args.transactions:,} transactions of up to 100 changes (70 updates, 20 "
              "deletes spread over the table, 10 inserts); each contender from a copy of "
              "the loaded pipeline")
        for run in range(args.runs):
            for contender in contenders if run % 2 == 0 else contenders[::-1]:
                base = work / f"{slots[(contender.name, run)]}"
                shutil.copytree(loaded, base)
                file = _pipeline_file(base, dsn, slots[(contender.name, run)],
                                      contender.master, contender.conf, contender.apply_on)
                seconds, peaks, log = run_pipeline(file, "--log-level", "debug")
                changes, window, read, merge = _batch_window(log)
                source, lake = compare(dsn, "public.t10", str(base / "lake/t10"), _COLUMNS)
                if source != lake:
                    raise SystemExit(f"{contender.name}: Delta differs from PostgreSQL")
                contender.rates.append(changes / window)
                contender.walls.append(seconds)
                contender.drivers.append(peaks.driver)
                contender.jvms.append(peaks.jvm)
                print(f"  {contender.name}: {changes:,} changes merged in {window:.2f} s "
                      f"({changes / window:,.0f}/s; "
                      f"{sum(1 for line in log.splitlines() if _TOOK.match(line))} batches, "
                      f"{'read' if contender.apply_on == 'driver' else 'plan'} {read:.2f} s"
                      f"{' (spilled)' if 'the executors write it to' in log else ''}, "
                      f"{'merge' if contender.apply_on == 'driver' else 'executors'} "
                      f"{merge:.2f} s; "
                      f"run {seconds:.1f} s wall), driver "
                      f"{peaks.driver / 2**20:.0f} MiB, its JVM {peaks.jvm / 2**20:.0f} MiB; "
                      "Delta equals PostgreSQL")
                shutil.rmtree(base)
        print(f"\nmedians of {args.runs} runs:")
        for group in (contenders[:3], contenders[3:]):
            local1, local2, cluster = (statistics.median(c.rates) for c in group)
            for contender in group:
                rate = statistics.median(contender.rates)
                print(f"  {contender.name:28s} {rate:>9,.0f} changes/s ({rate / local1:.2f}x "
                      f"local[1]), driver "
                      f"{statistics.median(contender.drivers) / 2**20:.0f} MiB, JVM "
                      f"{statistics.median(contender.jvms) / 2**20:.0f} MiB")
            print(f"  {group[0].apply_on} apply: local[2] / local[1] {local2 / local1:.2f}x, "
                  f"standalone / local[2] {cluster / local2:.2f}x")


if __name__ == "__main__":
    main()
