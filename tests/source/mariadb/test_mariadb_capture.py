"""The MariaDB source on a real MariaDB server: types, operations, positions, errors.

Every test gets a fresh database on the session's private server (``mdb``), whose
binlog is ROW-based with full images and full metadata, as tidemark requires.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import MariaDatabase
from mariadb_helpers import (
    ALL_TYPES,
    ROW_1,
    _capture_process,
    _config,
    _ids,
    _lines,
    _wait_for_offsets,
    capture,
    values,
)
from tidemark.errors import ConfigError, SourceError, SourceUnavailableError
from tidemark.event import ChangeEvent, Record, TransactionBoundary
from tidemark.offsets.store import Offset
from tidemark.serde.debezium_json import DebeziumJsonSerializer
from tidemark.source.mariadb.config import MariaDbSourceConfig
from tidemark.source.mariadb.reader import MariaDbReader
from tidemark.testing.local_server import free_port
from tidemark.testing.mariadb import MariaDbServer

#: What Debezium's MariaDB/MySQL connector writes for ROW_1 (its documented mapping:
#: decimals as base64 of the unscaled value, DATETIME(0-3) epoch ms, DATETIME(4-6)
#: epoch µs, TIME µs, TIMESTAMP as UTC ISO text, BIT(n>1) bytes, unsigned bigint wrapped).
EXPECTED_1 = {
    "id": 1, "ti": -128, "tu": 255, "si": -32768, "su": 65535, "mi": -8388608,
    "mu": 16777215, "i": -2147483648, "iu": 4294967295, "bi": -9223372036854775808,
    "bu": -1, "f": 1.1, "d": 2.2, "dec1": "+y4=", "dec2": "/ALKFJKGhW5Bxwyy",
    "dec3": "AYaf", "b1": True, "b9": "AQE=", "y": 2024, "dt": 19782,
    "tm": -3020399123000, "tm0": 43200000000, "dtm": 1704164645678901,
    "dtm0": 946684799000, "ts": "2024-06-01T12:00:00.50Z", "c": "ab", "vc": "x" * 300,
    "tx": "h\u00e9llo", "bn": "YWIAAA==", "vb": "AP8=", "bl": "3q2+7w==", "e": "b",
    "s": "x,z", "j": '{"a": 1}', "lat": "caf\u00e9",
}


def test_every_type_streams_as_debezium_writes_it_and_equals_the_snapshot(
        mdb: MariaDatabase) -> None:
    mdb.execute(ALL_TYPES)
    streamed, offset = capture(_config(mdb, snapshot_mode="no_data"))
    assert streamed == []
    mdb.execute(ROW_1, "INSERT INTO everything (id) VALUES (2)")
    streamed, _ = capture(_config(mdb), offset)
    rows = values(streamed)
    assert [v["op"] for v in rows] == ["c", "c"]
    assert rows[0]["after"] == EXPECTED_1
    assert rows[1]["after"] == {name: (2 if name == "id" else None) for name in EXPECTED_1}
    # The snapshot reads the same rows through SQL: the same values, to the byte.
    snapshot, _ = capture(_config(mdb, snapshot_mode="initial_only"))
    assert [v["after"] for v in values(snapshot)] == [v["after"] for v in rows]
    assert {v["op"] for v in values(snapshot)} == {"r"}


def test_compiled_and_python_writers_agree_on_mariadb_events(mdb: MariaDatabase) -> None:
    mdb.execute(ALL_TYPES)
    _, offset = capture(_config(mdb, snapshot_mode="no_data"))
    mdb.execute(ROW_1, "UPDATE everything SET vc = 'short' WHERE id = 1",
                "DELETE FROM everything WHERE id = 1")
    records, _ = capture(_config(mdb), offset)
    events = [r for r in records if isinstance(r, ChangeEvent)]
    compiled = DebeziumJsonSerializer(compiled=True)
    python = DebeziumJsonSerializer(compiled=False)
    for event in events:
        expected = python.general_key_and_value(event)
        assert compiled.key_and_value(event) == expected
        assert python.key_and_value(event) == expected


def test_operations_transactions_and_the_source_block(mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(10))",
                "CREATE TABLE b (k1 INT, k2 VARCHAR(5), n INT, PRIMARY KEY (k2, k1))")
    _, offset = capture(_config(mdb, snapshot_mode="no_data"))
    mdb.execute("INSERT INTO a VALUES (1, 'x'), (2, 'y')", "INSERT INTO b VALUES (1, 'p', 0)",
                "UPDATE a SET v = 'z' WHERE id = 2")
    mdb.execute("UPDATE a SET id = 10 WHERE id = 1")  # a primary-key change
    mdb.execute("DELETE FROM b")
    records, after = capture(_config(mdb, provide_transaction_metadata=True), offset)
    rows = values(records)
    # The primary-key change is a delete of the old key and a create of the new one.
    assert [(v["op"], v["source"]["table"]) for v in rows] == [
        ("c", "a"), ("c", "a"), ("c", "b"), ("u", "a"), ("d", "a"), ("c", "a"), ("d", "b")]
    first_tx = rows[:4]
    assert len({v["source"]["gtid"] for v in first_tx}) == 1
    assert [v["source"]["row"] for v in first_tx] == [0, 1, 0, 0]
    assert first_tx[0]["source"]["pos"] == first_tx[1]["source"]["pos"]  # one rows event
    source = first_tx[0]["source"]
    assert list(source) == ["version", "connector", "name", "ts_ms", "snapshot", "db",
                            "sequence", "ts_us", "ts_ns", "table", "server_id", "gtid",
                            "file", "pos", "row", "thread", "query"]
    assert source["connector"] == "mariadb" and source["db"] == mdb.name
    assert source["gtid"].startswith("0-1-") and source["file"].startswith("binlog.")
    assert rows[4]["before"] == {"id": 1, "v": "x"} and rows[5]["after"] == {"id": 10, "v": "x"}
    assert rows[4]["source"]["pos"] == rows[5]["source"]["pos"]
    events = [r for r in records if isinstance(r, ChangeEvent)]
    # The engine's view of the block (ChangeEvent.source) holds the same fields.
    assert [e.source.fields for e in events] == [
        {name: v["source"][name] for name in list(source)[10:]} for v in rows]
    keys = [json.loads(DebeziumJsonSerializer().key_and_value(r)[0])
            for r in records if isinstance(r, ChangeEvent)]
    assert keys[2] == {"k2": "p", "k1": 1}  # the key in primary-key order
    tx = [r for r in records if not isinstance(r, ChangeEvent)]
    assert [t.status for t in tx] == ["BEGIN", "END"] * 3  # type: ignore[union-attr]
    assert tx[1].event_count == 4  # type: ignore[union-attr]
    assert after is not None and after["binlog"]["gtids"] == rows[-1]["source"]["gtid"]


def test_savepoints_year_signedness_and_bits(mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, y YEAR, amount INT, bits BIT(16))",
                "INSERT INTO t VALUES (1, 2024, -5, b'0000000100000000')")
    snapshot, offset = capture(_config(mdb))
    # An ORM's nested transaction: savepoints inside one transaction, which stays whole.
    mdb.execute("INSERT INTO t VALUES (2, 2000, -7, b'1')", "SAVEPOINT sp1",
                "INSERT INTO t VALUES (3, 2001, -8, b'1')", "ROLLBACK TO SAVEPOINT sp1",
                "INSERT INTO t VALUES (4, 2002, -9, b'1')", "RELEASE SAVEPOINT sp1")
    records, after = capture(_config(mdb), offset)
    rows = values(records)
    assert [(v["op"], v["after"]["id"]) for v in rows] == [("c", 2), ("c", 4)]
    assert len({v["source"]["gtid"] for v in rows}) == 1
    assert after is not None and after["binlog"]["gtids"] == rows[0]["source"]["gtid"]
    # A YEAR before a signed column must not shift its sign; bit(n) is little-endian
    # (Debezium's Bits): 256 is 00 01, in the snapshot and the stream alike.
    first = values(snapshot)[0]["after"]
    assert first == {"id": 1, "y": 2024, "amount": -5, "bits": "AAE="}
    assert rows[0]["after"]["amount"] == -7 and rows[0]["after"]["bits"] == "AQA="


def test_a_geometry_column_keeps_the_charsets_of_later_columns(mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE g (id INT PRIMARY KEY, shape GEOMETRY, name VARCHAR(10) "
                "CHARACTER SET latin1, data VARBINARY(4))")
    _, offset = capture(_config(mdb, snapshot_mode="no_data"))
    mdb.execute("INSERT INTO g VALUES (1, ST_GeomFromText('POINT(1 2)'), 'caf\u00e9', "
                "x'ff00fe01')")
    after = values(capture(_config(mdb), offset)[0])[0]["after"]
    assert after["name"] == "caf\u00e9" and after["data"] == "/wD+AQ=="


def test_latin1_bytes_stream_as_a_select_reads_them(mdb: MariaDatabase) -> None:
    """MariaDB's latin1 is cp1252 (0x80 is the euro sign, 0x81 a control character):
    every byte of a latin1 value decodes from the binlog to the text a SELECT returns
    (issue 38 found 0x80-0x9F read as ISO-8859-1)."""
    mdb.execute("CREATE TABLE l1 (id INT PRIMARY KEY, v VARCHAR(4) CHARACTER SET latin1, "
                "t TEXT CHARACTER SET latin1)")
    _, offset = capture(_config(mdb, snapshot_mode="no_data"))
    mdb.execute(*(f"INSERT INTO l1 VALUES ({b}, x'{b:02x}41', x'41{b:02x}')"
                  for b in range(1, 256)))
    streamed = {row["after"]["id"]: row["after"]
                for row in values(capture(_config(mdb), offset)[0])}
    conn = mdb.server.connect(mdb.name)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id, v, t FROM l1")
            selected = {int(i): {"id": int(i), "v": v, "t": t} for i, v, t in cur.fetchall()}
    finally:
        conn.close()
    assert selected[0x80]["v"] == "\u20acA" and selected[0x81]["v"] == "\x81A"
    assert streamed == selected


def test_initial_only_does_nothing_more_once_taken(mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    records, offset = capture(_config(mdb, snapshot_mode="initial_only"))
    assert [v["op"] for v in values(records)] == ["r"]
    mdb.execute("INSERT INTO t VALUES (2)")
    again, _ = capture(_config(mdb, snapshot_mode="initial_only"), offset)
    assert again == []


def test_truncate_and_ddl_mid_stream(mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, a INT)")
    _, offset = capture(_config(mdb, snapshot_mode="no_data"))
    mdb.execute("INSERT INTO t VALUES (1, 1)")
    mdb.execute("ALTER TABLE t ADD COLUMN b VARCHAR(5) DEFAULT 'new'")
    mdb.execute("INSERT INTO t VALUES (2, 2, 'two')")
    mdb.execute("ALTER TABLE t DROP COLUMN a")
    mdb.execute("UPDATE t SET b = 'x' WHERE id = 1")
    mdb.execute("TRUNCATE TABLE t")
    rows = values(capture(_config(mdb), offset)[0])
    assert [v["op"] for v in rows] == ["c", "c", "u", "t"]
    assert rows[0]["after"] == {"id": 1, "a": 1}
    assert rows[1]["after"] == {"id": 2, "a": 2, "b": "two"}
    assert rows[2]["before"] == {"id": 1, "b": "new"} and rows[2]["after"] == {"id": 1, "b": "x"}
    assert rows[3]["source"]["table"] == "t"


def test_xa_transactions_are_captured_at_prepare_and_a_rollback_after_it_is_warned(
        mdb: MariaDatabase, caplog: pytest.LogCaptureFixture) -> None:
    """An XA transaction's rows are binlogged in a group that XA PREPARE ends, not an
    XID; XA COMMIT follows as a group of its own. Its changes go out at the prepare, as
    Debezium sends them (they were once lost silently)."""
    mdb.execute("CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(20))")
    _, offset = capture(_config(mdb, snapshot_mode="no_data"))

    def run(*statements: str) -> None:  # XA needs autocommit, not MariaDatabase's BEGIN
        conn = mdb.server.connect(mdb.name)
        conn.autocommit(True)
        with contextlib.closing(conn), conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    run("XA START 'x1'", "INSERT INTO a VALUES (1, 'prepared')", "UPDATE a SET v = 'both' "
        "WHERE id = 1", "XA END 'x1'", "XA PREPARE 'x1'")
    mdb.execute("INSERT INTO a VALUES (2, 'between')")
    run("XA COMMIT 'x1'")
    run("XA START 'x2'", "INSERT INTO a VALUES (3, 'one phase')", "XA END 'x2'",
        "XA COMMIT 'x2' ONE PHASE")
    run("XA START 'x3'", "INSERT INTO a VALUES (4, 'rolled back')", "XA END 'x3'",
        "XA PREPARE 'x3'", "XA ROLLBACK 'x3'")
    with caplog.at_level("DEBUG", logger="tidemark.source.mariadb.change_builder"):
        records, after = capture(_config(mdb), offset)
    rows = values(records)
    assert [(v["op"], v["after"]["id"]) for v in rows] == [
        ("c", 1), ("u", 1), ("c", 2), ("c", 3), ("c", 4)]
    assert len({v["source"]["gtid"] for v in rows[:2]}) == 1  # one transaction
    assert "XA PREPARE 1:x1:" in caplog.text
    assert "XA ROLLBACK X'7833'" in caplog.text and "are not undone" in caplog.text
    # The offset is past every group: a restart sends nothing again.
    again, _ = capture(_config(mdb), after)
    assert values(again) == []


def test_a_table_without_a_primary_key_is_captured_keyless_with_a_warning(
        mdb: MariaDatabase, caplog: pytest.LogCaptureFixture) -> None:
    mdb.execute("CREATE TABLE nokey (a INT, b VARCHAR(5))")
    _, offset = capture(_config(mdb, snapshot_mode="no_data"))
    mdb.execute("INSERT INTO nokey VALUES (1, 'x')", "DELETE FROM nokey")
    with caplog.at_level("WARNING", logger="tidemark.source.mariadb.change_builder"):
        records, _ = capture(_config(mdb), offset)
    assert [v["op"] for v in values(records)] == ["c", "d"]
    assert [DebeziumJsonSerializer().key_and_value(r)[0] for r in records] == ["null", "null"]
    assert f"table {mdb.name}.nokey has no primary key" in caplog.text


def test_other_databases_and_excluded_tables_are_not_captured(mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE keep (id INT PRIMARY KEY)", "CREATE TABLE skip (id INT PRIMARY KEY)")
    other = f"{mdb.name}_other"
    conn = mdb.server.connect()
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {other}")
        cur.execute(f"CREATE TABLE {other}.t (id INT PRIMARY KEY)")
    try:
        _, offset = capture(_config(mdb, snapshot_mode="no_data"))
        mdb.execute("INSERT INTO keep VALUES (1)", "INSERT INTO skip VALUES (1)",
                    f"INSERT INTO {other}.t VALUES (1)")
        rows = values(capture(_config(mdb, table_exclude_list=[f"{mdb.name}\\.skip"]),
                              offset)[0])
        assert [(v["source"]["db"], v["source"]["table"]) for v in rows] == [(mdb.name, "keep")]
    finally:
        conn = mdb.server.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute(f"DROP DATABASE {other}")


def test_snapshot_then_stream_loses_nothing_and_repeats_nothing(mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY, n INT)",
                "INSERT INTO t VALUES " + ",".join(f"({i}, 0)" for i in range(1, 2001)))
    config = _config(mdb, snapshot_fetch_size=300)
    records, offset = capture(config)
    rows = values(records)
    assert len(rows) == 2000 and {v["op"] for v in rows} == {"r"}
    assert [rows[0]["source"]["snapshot"], rows[1]["source"]["snapshot"],
            rows[-1]["source"]["snapshot"]] == ["first", "true", "last"]
    mdb.execute("UPDATE t SET n = 1 WHERE id <= 10")
    more = values(capture(config, offset)[0])
    assert [(v["op"], v["after"]["id"]) for v in more] == [("u", i) for i in range(1, 11)]


def test_a_purged_binlog_is_an_error_that_says_what_to_do(mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    _, offset = capture(_config(mdb, snapshot_mode="no_data"))
    assert offset is not None
    stale = {"binlog": {"file": "binlog.000000", "pos": 4, "gtids": "0-1-999999999"}}
    with pytest.raises(SourceError, match="purged") as caught:
        capture(_config(mdb), stale)
    assert "when_needed" in str(caught.value)


def test_when_needed_takes_a_new_snapshot_after_the_binlog_was_purged(
        mdb: MariaDatabase) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    _, offset = capture(_config(mdb))
    assert offset is not None
    mdb.execute("INSERT INTO t VALUES (2)")
    # The offset names a binlog the server no longer has (as after PURGE BINARY LOGS).
    gone = {"binlog": {**offset["binlog"], "file": "binlog.000000", "gtids": ""}}
    with pytest.raises(SourceError, match="purged"):
        capture(_config(mdb), gone)
    records, after = capture(_config(mdb, snapshot_mode="when_needed"), gone)
    assert sorted((v["op"], v["after"]["id"]) for v in values(records)) == [("r", 1), ("r", 2)]
    assert after is not None and after["binlog"]["file"].startswith("binlog.0")


@pytest.mark.parametrize(("variable", "value", "named"), [
    ("binlog_format", "STATEMENT", "binlog_format is STATEMENT"),
    ("binlog_row_image", "MINIMAL", "binlog_row_image is MINIMAL"),
    ("binlog_row_metadata", "MINIMAL", "binlog_row_metadata is MINIMAL"),
])
def test_a_server_that_cannot_be_captured_is_named_with_the_fix(
        mdb: MariaDatabase, variable: str, value: str, named: str) -> None:
    conn = mdb.server.connect()
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute(f"SELECT @@GLOBAL.{variable}")
        old = cur.fetchone()[0]  # type: ignore[index]
        cur.execute(f"SET GLOBAL {variable} = '{value}'")
        try:
            with pytest.raises(SourceError, match=named) as caught:
                capture(_config(mdb))
            assert f"set {variable}=" in str(caught.value)
        finally:
            cur.execute(f"SET GLOBAL {variable} = '{old}'")


def test_bad_logins_hosts_grants_and_urls_are_clear_errors(mdb: MariaDatabase) -> None:
    server = mdb.server
    bad_password = f"mariadb://{server.user}:wrong@{server.host}:{server.port}/{mdb.name}"
    with pytest.raises(ConfigError, match="refused the login of tidemark@"):
        capture(MariaDbSourceConfig.from_mapping({"dsn": bad_password}))
    nobody = f"mariadb://u:p@127.0.0.1:{free_port()}/x"
    with pytest.raises(SourceUnavailableError, match=r"cannot connect to MariaDB at 127\.0\.0\.1"):
        capture(MariaDbSourceConfig.from_mapping({"dsn": nobody, "reconnect_max_attempts": 0}))
    with pytest.raises(ConfigError, match=r"not a MariaDB URL"):
        MariaDbSourceConfig.from_mapping({"dsn": "postgres://x@y/z"})
    with pytest.raises(ConfigError, match="unknown setting"):
        MariaDbSourceConfig.from_mapping({"dsn": mdb.dsn, "slot_name": "x"})
    conn = server.connect()
    with contextlib.closing(conn), conn.cursor() as cur:
        cur.execute("CREATE USER IF NOT EXISTS 'reader'@'%' IDENTIFIED BY 'pw'")
        cur.execute(f"GRANT SELECT ON {mdb.name}.* TO 'reader'@'%'")
    reader = f"mariadb://reader:pw@{server.host}:{server.port}/{mdb.name}"
    with pytest.raises(SourceError, match="GRANT BINLOG MONITOR, REPLICATION SLAVE ON") as caught:
        capture(MariaDbSourceConfig.from_mapping({"dsn": reader, "snapshot_mode": "no_data"}))
    assert "pw" not in str(caught.value)
    # The grants the README names are enough for a snapshot and the stream.
    with contextlib.closing(server.connect()) as conn, conn.cursor() as cur:
        cur.execute("GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'reader'@'%'")
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    records, _ = capture(MariaDbSourceConfig.from_mapping({"dsn": reader}))
    assert [v["after"] for v in values(records)] == [{"id": 1}]


def _wait_for_lines(path: Path, count: int, process: subprocess.Popen[bytes],
                    timeout_s: float = 60) -> list[str]:
    """Wait until *path* holds *count* lines while *process* runs."""
    deadline = time.monotonic() + timeout_s
    while len(_lines(path)) < count:
        if process.poll() is not None:
            stderr = process.stderr.read().decode() if process.stderr else ""
            raise AssertionError(f"capture exited with {process.returncode}: {stderr[-2000:]}")
        assert time.monotonic() < deadline, f"no {count} lines in {path} in {timeout_s} s"
        time.sleep(0.02)
    return _lines(path)


def test_sigkilled_capture_resumes_from_its_offsets_without_losing_a_row(
        mdb: MariaDatabase, tmp_path: Path, kill_on_exit: list[subprocess.Popen[bytes]]) -> None:
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    offsets, out = tmp_path / "offsets.json", tmp_path / "first.jsonl"
    first = _capture_process(mdb.dsn, offsets, out, "--snapshot-mode", "no_data")
    kill_on_exit.append(first)
    _wait_for_offsets(offsets, first)
    for tx in range(10):
        mdb.execute(*(f"INSERT INTO t VALUES ({tx * 10 + i + 1})" for i in range(10)))
    seen = _ids(_wait_for_lines(out, 50, first))
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    seen = _ids(_lines(out))
    for tx in range(10, 20):
        mdb.execute(*(f"INSERT INTO t VALUES ({tx * 10 + i + 1})" for i in range(10)))
    second = _capture_process(mdb.dsn, offsets, tmp_path / "second.jsonl", "--stop-at-end")
    kill_on_exit.append(second)
    _, err = second.communicate(timeout=60)
    assert second.returncode == 0, err.decode()
    after = _ids(_lines(tmp_path / "second.jsonl"))
    # At-least-once: every row arrives; a transaction whose offset was not saved comes
    # again whole, never a part of it.
    assert set(seen) | set(after) == set(range(1, 201))
    assert after == sorted(after) and after[-1] == 200 and after[0] % 10 == 1
    assert after[0] <= max(seen) + 1


def test_capture_survives_a_server_restart_mid_stream(
        tmp_path: Path, kill_on_exit: list[subprocess.Popen[bytes]]) -> None:
    with MariaDbServer() as server:  # its own server: the restart must not hit others
        conn = server.connect()
        with contextlib.closing(conn), conn.cursor() as cur:
            cur.execute("CREATE DATABASE r")
            cur.execute("CREATE TABLE r.t (id INT PRIMARY KEY)")
        offsets, out = tmp_path / "o.json", tmp_path / "out.jsonl"
        process = _capture_process(server.dsn("r"), offsets, out,
                                   "--snapshot-mode", "no_data")
        kill_on_exit.append(process)
        _wait_for_offsets(offsets, process)

        def insert(first: int, last: int) -> None:
            conn = server.connect()
            with contextlib.closing(conn), conn.cursor() as cur:
                for i in range(first, last + 1):
                    cur.execute("INSERT INTO r.t VALUES (%s)", (i,))

        insert(1, 10)
        _wait_for_lines(out, 10, process)
        server.restart()
        insert(11, 30)
        assert _ids(_wait_for_lines(out, 30, process)) == list(range(1, 31))
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


def test_status_reports_the_position_and_a_purged_binlog(
        mdb: MariaDatabase, tmp_path: Path) -> None:
    from tidemark.status import mariadb as status  # noqa: PLC0415

    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    _, offset = capture(_config(mdb))
    assert offset is not None
    settings = MariaDbSourceConfig.from_mapping({"dsn": mdb.dsn}).connection
    offsets = tmp_path / "offsets.json"
    key = f"mariadb/{settings.host}:{settings.port}/tidemark"
    offsets.write_text(json.dumps({key: offset}))
    mdb.execute("INSERT INTO t VALUES (2)")
    healthy = status.capture_status(mdb.dsn, str(offsets))
    assert healthy["healthy"] and healthy["offsets"]["found"]
    assert healthy["lag"]["bytes"] > 0  # the insert after the saved offset
    assert "binlog behind" in status.render_capture(healthy)

    offsets.write_text(json.dumps({key: {"binlog": {**offset["binlog"],
                                                    "file": "binlog.000000"}}}))
    purged = status.capture_status(mdb.dsn, str(offsets))
    assert not purged["healthy"]
    assert "no longer has" in purged["problems"][0]
    assert "snapshot_mode=when_needed" in purged["problems"][0]


def _without_times(value: dict[str, Any]) -> dict[str, Any]:
    """A change event's value without the times of its handing on (they differ run to
    run): the commit time, in source, stays."""
    return {k: v for k, v in value.items() if k not in ("ts_ms", "ts_us", "ts_ns")}


def test_a_transaction_larger_than_memory_is_handed_on_in_batches_with_one_offset(
        mdb: MariaDatabase, caplog: pytest.LogCaptureFixture) -> None:
    """Past max_transaction_rows_in_memory a transaction's rows wait in a temporary file;
    it comes out in batches of max_batch_events, event for event what it is whole, and
    only its last batch carries an offset (a restart before it repeats all of it)."""
    mdb.execute("CREATE TABLE a (id INT PRIMARY KEY, v VARCHAR(20))",
                "CREATE TABLE b (id INT PRIMARY KEY, n INT)")
    _, start = capture(_config(mdb, snapshot_mode="no_data"))
    mdb.execute("INSERT INTO a SELECT seq, CONCAT('a', seq) FROM seq_1_to_3000",
                "INSERT INTO b SELECT seq, seq FROM seq_1_to_2000",
                "UPDATE a SET id = id + 10000 WHERE id <= 100",  # key changes: d + c
                "UPDATE b SET n = -n WHERE id % 2 = 0",
                "DELETE FROM a WHERE id BETWEEN 500 AND 799")
    mdb.execute("INSERT INTO b VALUES (5001, 1)")  # a small transaction after it
    whole, whole_end = capture(_config(mdb, provide_transaction_metadata=True), start)
    # 3000 + 2000 inserts, 2 x 100 for the key changes, 1000 updates, 300 deletes, 1.
    assert len(values(whole)) == 6501

    settings = {"provide_transaction_metadata": True, "max_transaction_rows_in_memory": 700,
                "max_batch_events": 1000}
    connector = MariaDbReader(_config(mdb, **settings))
    batches: list[tuple[list[Record], Offset | None]] = []
    with caplog.at_level(logging.INFO, logger="tidemark.source.mariadb"):
        connector.start(start, stop_at_end=True)
        try:
            deadline = time.monotonic() + 60
            while (batch := connector.poll()) and not batch.finished:
                assert time.monotonic() < deadline, "capture did not reach the binlog's end"
                if batch.records or batch.offset:
                    batches.append((batch.records, batch.offset))
            batches.append((batch.records, batch.offset))
        finally:
            connector.stop()
    assert "waits in a temporary file" in caplog.text
    chunked = [r for records, _ in batches for r in records]
    assert [_without_times(v) for v in values(chunked)] == \
        [_without_times(v) for v in values(whole)]
    boundaries = [r for r in chunked if isinstance(r, TransactionBoundary)]
    assert [(t.status, t.event_count) for t in boundaries] == [
        ("BEGIN", None), ("END", 6500), ("BEGIN", None), ("END", 1)]
    assert boundaries[1].data_collections == (  # counted over every batch
        (f"{mdb.name}.a", 3000 + 200 + 300), (f"{mdb.name}.b", 2000 + 1000))
    # The big transaction spans batches; none of them but its last has an offset.
    holding = [offset for records, offset in batches
               if any(isinstance(r, ChangeEvent) and r.source.fields["gtid"] ==
                      values(whole)[0]["source"]["gtid"] for r in records)]
    assert len(holding) >= 3 and holding[:-1] == [None] * (len(holding) - 1)
    assert holding[-1] is not None  # after it (and perhaps the small one, same batch)
    # A batch takes queued pieces until it holds 1,000 events; the transaction's first
    # piece is what was held in memory: 700 rows and the rest of the rows event that
    # passed them (8 KB: some 1,300 of these rows).
    assert max(len(records) for records, _ in batches) <= 1000 + 700 + 1400
    assert [offset for _, offset in batches if offset][-1] == whole_end


def test_a_capture_cut_inside_a_large_transaction_delivers_it_whole_after_a_restart(
        mdb: MariaDatabase, tmp_path: Path, kill_on_exit: list[subprocess.Popen[bytes]]) -> None:
    """The CLI (default settings: 10,000 rows held) stopped in the middle of a
    12,000-row transaction saves no offset inside it: the next run delivers all of it."""
    mdb.execute("CREATE TABLE t (id INT PRIMARY KEY)")
    offsets = tmp_path / "offsets.json"
    first = _capture_process(mdb.dsn, offsets, tmp_path / "first.jsonl",
                             "--snapshot-mode", "no_data", "--stop-at-end")
    kill_on_exit.append(first)
    assert first.wait(timeout=60) == 0
    mdb.execute("INSERT INTO t VALUES (0)")
    mdb.execute("INSERT INTO t SELECT seq FROM seq_1_to_12000")
    cut = _capture_process(mdb.dsn, offsets, tmp_path / "cut.jsonl", "--max-events", "11000")
    kill_on_exit.append(cut)
    _, err = cut.communicate(timeout=60)
    assert cut.returncode == 0, err.decode()
    assert _ids(_lines(tmp_path / "cut.jsonl")) == list(range(11000))
    again = _capture_process(mdb.dsn, offsets, tmp_path / "again.jsonl", "--stop-at-end")
    kill_on_exit.append(again)
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0, err.decode()
    # The first transaction's offset was saved; the cut one comes again, whole.
    assert _ids(_lines(tmp_path / "again.jsonl")) == list(range(1, 12001))


def test_tidemark_run_s_binlog_reader_holds_a_transaction_of_wide_rows_by_bytes(
        mdb: MariaDatabase) -> None:
    """tidemark run's binlog reader held arrowBatchRows (65,536) rows of a transaction
    before its temporary file, and decoded the rest in chunks as many: 64 GB of 1 MB
    rows. Held and decoded by about arrowBatchBytes too, reading a 100 MB transaction
    takes some 30 MB of Python memory, as a small one (it took 126 MB)."""
    import tracemalloc  # noqa: PLC0415

    from tidemark.source.mariadb import client  # noqa: PLC0415
    from tidemark.spark.options import SourceOptions  # noqa: PLC0415
    from tidemark.spark.source import TidemarkDataSource  # noqa: PLC0415
    from tidemark.spark.sources import spark_source  # noqa: PLC0415

    mdb.execute("CREATE TABLE w (id INT PRIMARY KEY, v LONGTEXT)")
    with contextlib.closing(client.connect(client.parse_url(mdb.dsn))) as conn:
        start = client.current_position(conn).to_offset()
    mdb.execute("INSERT INTO w SELECT seq, REPEAT(CHAR(65 + seq % 26), 1048576) "
                "FROM seq_1_to_100")
    with contextlib.closing(client.connect(client.parse_url(mdb.dsn))) as conn:
        end = client.current_position(conn).to_offset()
    options = SourceOptions.parse({"dsn": mdb.dsn, "tables": f"{mdb.name}.w",
                                   "rowFormat": "arrow"})
    schema = TidemarkDataSource._stream_schema(options,
                                               spark_source(options).table_schemas(options))
    reader = spark_source(options).stream_reader(options, schema)
    start = {**start, "snapshot": [], "signals": None}
    end = {**end, "snapshot": [], "loaded": [], "signals": None}
    rows = 0
    tracemalloc.start()
    try:
        for partition in reader.partitions(start, end):
            for batch in reader.read(partition):
                rows += sum(batch.column(1).to_pylist())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows == 100
    assert peak < 56 << 20, f"{peak >> 20} MiB of Python memory for 100 rows of 1 MB"
