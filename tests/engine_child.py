"""A process that runs the engine for the kill/restart tests.

It writes one line per delivered record to --out (the synthetic source's position, or
the ``id`` of a PostgreSQL row) and flushes before the consumer returns, so that what is
in the file is exactly what was processed when the process is killed. Offsets are saved
to --offsets after every processed batch.

With --json the engine has the Debezium JSON converter and no transforms: the PostgreSQL
task's fused path, whose records (RenderedRecord) the task makes itself, in batches
(ConvertedBatch) the converter passes on; the id is read from the JSON value, and a
streamed change's record or a batch that did not take that path is named in
``<out>.general``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from typing import Any

from tidemark.engine.converters import (
    ConvertedBatch,
    ConvertedRecord,
    DebeziumJsonConverter,
    EventConverter,
    RenderedRecord,
)
from tidemark.engine.engine import Engine
from tidemark.event import ChangeEvent
from tidemark.offsets.file import FileOffsetStore
from tidemark.source.postgres.task import PostgresConnector
from tidemark.source.synthetic import SyntheticConnector
from tidemark.testing.postgres import sql_connection


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True)
    parser.add_argument("--offsets", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--total", type=int, help="synthetic: records to produce")
    parser.add_argument("--dsn", help="PostgreSQL: capture table t of this database")
    parser.add_argument("--stop-after-id", type=int,
                        help="PostgreSQL: stop once the row with this id (the last one "
                             "written) came; close() then drains what is in flight")
    parser.add_argument("--max-in-flight", type=int, default=1000)
    parser.add_argument("--stall-every", type=int, default=0,
                        help="the consumer stalls for 100 ms at every position (or id) "
                             "divisible by this: while one worker stalls the others "
                             "finish what is in flight behind it, the worst case for "
                             "what a crash redelivers")
    parser.add_argument("--json", action="store_true",
                        help="PostgreSQL: Debezium JSON, no transforms (the fused path)")
    parser.add_argument("--signal-table",
                        help="PostgreSQL: incremental snapshots signalled through this "
                             "table (chunks of 100 rows, no initial snapshot); --out then "
                             "gets one JSON line [op, id, v] per change")
    parser.add_argument("--on-slot-lost", help="PostgreSQL: on_slot_lost")
    parser.add_argument("--snapshot-mode",
                        help="PostgreSQL: snapshot_mode (with --signal-table: no_data)")
    parser.add_argument("--stop-at-end", action="store_true",
                        help="PostgreSQL: finish once what is committed now is delivered")
    args = parser.parse_args()

    out = open(args.out, "a", buffering=1 << 16)  # noqa: SIM115 - lives as long as the process
    lock = threading.Lock()
    done = threading.Event()

    general = open(f"{args.out}.general", "a") if args.json else None  # noqa: SIM115

    def position(record: ConvertedRecord) -> int | None:
        if args.json:
            value = json.loads(record.value) if record.value is not None else None
            # (Snapshot reads are ChangeEvents the converter renders.)
            if (type(record) is not RenderedRecord and general is not None
                    and not (value and value["op"] == "r")):
                general.write(f"{type(record).__name__}\n")
                general.flush()
            return int(value["after"]["id"]) if value and value["after"] else None
        event = record.value
        if not isinstance(event, ChangeEvent):
            return None
        if args.dsn:
            return int(event.after["id"]) if event.after else None
        return event.lsn

    def row(record: ConvertedRecord) -> str | None:
        event = record.value
        if not isinstance(event, ChangeEvent):
            return None
        values = event.after if event.after is not None else event.before
        if values is None:
            return None
        return json.dumps([event.op.value, values["id"], values.get("v")]) + "\n"

    def write(records: list[ConvertedRecord]) -> None:
        if args.signal_table:
            with lock:
                out.write("".join(r for r in map(row, records) if r is not None))
                out.flush()
            return
        lines = [f"{p}\n" for p in map(position, records) if p is not None]
        with lock:
            out.write("".join(lines))
            out.flush()
            if args.stop_after_id and f"{args.stop_after_id}\n" in lines:
                done.set()

    class BatchSink:
        def handle_batch(self, records: list[ConvertedRecord], committer: Any) -> None:
            # Records the task made, in a batch it made: the converter passed it on.
            if (general is not None and type(records) is not ConvertedBatch
                    and all(type(r) is RenderedRecord for r in records)):
                general.write(f"{type(records).__name__} of {len(records)} records\n")
                general.flush()
            write(records)
            if args.stall_every and any(((position(r) or 0) + 1) % args.stall_every == 0
                                        for r in records):
                time.sleep(0.1)

    def consume(record: ConvertedRecord) -> None:
        write([record])
        if args.stall_every:
            at = position(record)
            if at and (at + 1) % args.stall_every == 0:
                time.sleep(0.1)

    connector: Any
    if args.dsn:
        settings: dict[str, Any] = {
            "dsn": args.dsn, "table_include_list": ["public.t"], "slot_name": "kill_test",
            "max_batch_messages": 200, "heartbeat_interval_ms": 200}
        if args.signal_table:
            # Pinned: the kill test counts on chunks of 100 rows.
            settings.update(signal_table=args.signal_table, snapshot_mode="no_data",
                            incremental_snapshot_chunk_size=100,
                            incremental_snapshot_chunk_adaptive=False)
        if args.snapshot_mode:
            settings["snapshot_mode"] = args.snapshot_mode
        if args.on_slot_lost:
            settings["on_slot_lost"] = args.on_slot_lost
        stop_at = None
        if args.stop_at_end:
            with contextlib.closing(sql_connection(args.dsn)) as conn, conn.cursor() as cur:
                cur.execute("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint")
                now = cur.fetchone()
            stop_at = int(now[0]) if now else None
        connector = PostgresConnector(settings, stop_at_lsn=stop_at)
    else:
        connector = SyntheticConnector(total=args.total, batch_size=100)
    engine = Engine(
        connector, BatchSink() if args.mode == "batch" else consume,
        config={"delivery_mode": args.mode, "worker_count": 4, "offset_flush_interval_ms": 0,
                "max_in_flight": args.max_in_flight},
        converter=DebeziumJsonConverter() if args.json else EventConverter(),
        offset_store=FileOffsetStore(args.offsets))
    if args.stop_after_id:
        thread = threading.Thread(target=engine.run)
        thread.start()
        done.wait()
        engine.close()
        thread.join()
    else:
        engine.run()


if __name__ == "__main__":
    main()
