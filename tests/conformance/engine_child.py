"""The engine in a process of its own, for the matrix's engine columns: a connector built
from a class name and settings (JSON), one converter, its output written to a file.

Each record is one line, ``base64(pickle((identity, value, avro_schema, key, topic)))``:
the event's position (``lsn``, ``total_order``, ``op``: the same change delivered twice
has the same identity; None for a record without an event, such as a tombstone), the
converter's value exactly as it made it (JSON text, Avro bytes, an Arrow record batch),
for Avro the writer schema a reader needs, and the record's key and destination (for the
matrix's comparison with Debezium's own records). The converters take their
defaults, as a user's do: on log tables, non-key columns as cells. A batch's lines
are written and flushed before the consumer returns, and offsets are saved after every
batch (``offset_flush_interval_ms = 0``), so a SIGKILL leaves in the file what was
processed, and a restart redelivers at most ``max_in_flight`` records
(docs/configuration.md, "What a crash redelivers").

SIGTERM closes the engine the way a user does.
"""

from __future__ import annotations

import argparse
import base64
import json
import pickle
import signal
import threading
from typing import Any

import tidemark
from tidemark import Engine, SqliteOffsetStore


def _converter(name: str, options: dict[str, Any]) -> Any:
    from tidemark.engine.converters import DebeziumJsonConverter  # noqa: PLC0415
    from tidemark.serde.debezium_json import DebeziumJsonOptions  # noqa: PLC0415
    from tidemark.serde.modes import DecimalHandlingMode, TimePrecisionMode  # noqa: PLC0415

    if name == "json":
        modes = {"decimal_handling_mode": DecimalHandlingMode,
                 "time_precision_mode": TimePrecisionMode}
        return DebeziumJsonConverter(DebeziumJsonOptions(
            **{k: modes[k](v) if k in modes else v for k, v in options.items()}))
    if name == "avro":
        from tidemark.engine.avro_converter import AvroConverter  # noqa: PLC0415

        return AvroConverter()
    from tidemark.engine.arrow_converter import ArrowConverter  # noqa: PLC0415

    return ArrowConverter()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connector", required=True, help="a class of the tidemark package")
    parser.add_argument("--settings", required=True, help="its settings, JSON")
    parser.add_argument("--converter", required=True, choices=("json", "avro", "arrow"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--offsets", required=True)
    parser.add_argument("--max-in-flight", type=int, required=True)
    parser.add_argument("--json-options", default="{}",
                        help="DebeziumJsonOptions of the JSON converter, JSON")
    args = parser.parse_args()

    avro_schemas: Any = None
    if args.converter == "avro":
        from tidemark.serde.avro import avro_schemas  # noqa: PLC0415
    out = open(args.out, "ab")  # noqa: SIM115 - lives as long as the process

    def line(record: Any) -> bytes:
        event = record.event
        schema = None
        if avro_schemas is not None and record.value is not None:
            # The converter's options as the engine resolved them (a log table's cells).
            options = engine.converter.options  # type: ignore[attr-defined]
            schema = avro_schemas(event.schema, options, event.context.block)[1]
        identity = None if event is None else (event.lsn, event.total_order, str(event.op))
        return base64.b64encode(pickle.dumps(
            (identity, record.value, schema, record.key, record.destination))) + b"\n"

    class FileSink:
        def handle_batch(self, records: list[Any], committer: Any) -> None:
            out.write(b"".join(line(r) for r in records))
            out.flush()

    connector = getattr(tidemark, args.connector)(json.loads(args.settings))
    engine = Engine(connector, FileSink(),
                    config={"offset_flush_interval_ms": 0,
                            "max_in_flight": args.max_in_flight},
                    converter=_converter(args.converter, json.loads(args.json_options)),
                    offset_store=SqliteOffsetStore(args.offsets))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    while thread.is_alive() and not stop.wait(0.1):
        pass
    if thread.is_alive():
        engine.close()
    thread.join(60)


if __name__ == "__main__":
    main()
