"""MariaDB capture helpers shared by the MariaDB tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import MariaDatabase
from tidemark.event import ChangeEvent, Record
from tidemark.offsets.store import Offset
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.serde.modes import TimePrecisionMode
from tidemark.source.mariadb.config import MariaDbSourceConfig
from tidemark.source.mariadb.reader import MariaDbReader

ALL_TYPES = """CREATE TABLE everything (
    id INT PRIMARY KEY,
    ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED, mi MEDIUMINT,
    mu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED,
    f FLOAT, d DOUBLE, dec1 DECIMAL(10,2), dec2 DECIMAL(30,10), dec3 DECIMAL(5,0),
    b1 BIT(1), b9 BIT(9), y YEAR, dt DATE, tm TIME(3), tm0 TIME, dtm DATETIME(6),
    dtm0 DATETIME, ts TIMESTAMP(2) NULL, c CHAR(5), vc VARCHAR(300), tx TEXT,
    bn BINARY(4), vb VARBINARY(10), bl BLOB, e ENUM('a','b','c'), s SET('x','y','z'),
    j JSON, lat VARCHAR(10) CHARACTER SET latin1)"""


ROW_1 = """INSERT INTO everything VALUES (1, -128, 255, -32768, 65535, -8388608, 16777215,
    -2147483648, 4294967295, -9223372036854775808, 18446744073709551615, 1.1, 2.2,
    -12.34, -123456789012345678.9012345678, 99999, b'1', b'100000001', 2024,
    '2024-02-29', '-838:59:59.123', '12:00:00', '2024-01-02 03:04:05.678901',
    '1999-12-31 23:59:59', '2024-06-01 12:00:00.5', 'ab', REPEAT('x', 300), 'h\u00e9llo',
    'ab', x'00ff', x'deadbeef', 'b', 'x,z', '{"a": 1}', 'caf\u00e9')"""


def _config(mdb: MariaDatabase, **settings: Any) -> MariaDbSourceConfig:
    return MariaDbSourceConfig.from_mapping({"dsn": mdb.dsn, **settings})


def capture(config: MariaDbSourceConfig, offset: Offset | None = None,
            timeout_s: float = 60) -> tuple[list[Record], Offset | None]:
    """Everything up to the binlog's end now: the records and the last offset."""
    connector = MariaDbReader(config)
    records: list[Record] = []
    last: Offset | None = offset
    try:
        connector.start(offset, stop_at_end=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = connector.poll()
            records += batch.records
            if batch.offset is not None:
                last = batch.offset
            if batch.finished:
                return records, last
        raise AssertionError(f"capture did not reach the binlog's end in {timeout_s} s")
    finally:
        connector.stop()


def values(records: list[Record]) -> list[dict[str, Any]]:
    """The Debezium JSON values of the change events."""
    serializer = DebeziumJsonSerializer(DebeziumJsonOptions(
        time_precision_mode=TimePrecisionMode.ADAPTIVE_TIME_MICROSECONDS))
    return [json.loads(serializer.key_and_value(r)[1]) for r in records
            if isinstance(r, ChangeEvent)]


# -- tidemark capture: restart, SIGKILL, server restart ----------------------------------
def _capture_process(dsn: str, offsets: Path, out: Path, *extra: str
                     ) -> subprocess.Popen[bytes]:
    with out.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "tidemark", "capture", "--dsn", dsn, "--offsets",
             str(offsets), "--offset-flush-interval-ms", "0", *extra],
            stdout=sink, stderr=subprocess.PIPE)


def _lines(path: Path) -> list[str]:
    """The complete lines written to *path* so far."""
    text = path.read_text() if path.exists() else ""
    return text.split("\n")[:-1]


def _wait_for_offsets(offsets: Path, process: subprocess.Popen[bytes]) -> None:
    """Wait until the capture saved its first offset (once its stream is open)."""
    deadline = time.monotonic() + 30
    while not offsets.exists():
        assert process.poll() is None and time.monotonic() < deadline, "capture saved no offset"
        time.sleep(0.02)


def _ids(lines: list[str]) -> list[int]:
    values = [json.loads(line)["value"] for line in lines if line]
    return [v["after"]["id"] for v in values if v is not None and v["after"] is not None]


def _run_cli(config: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with log.open("ab") as out:
        # A session of its own: the SIGKILL of its group hits the driver and its JVM.
        return subprocess.Popen([sys.executable, "-m", "tidemark", "run", str(config), *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
