"""Debezium's signals: parsing (Debezium's own examples, and everything malformed), the
signal table's layout, ``send_signal`` and ``tidemark signal`` on a real PostgreSQL."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import Database
from tidemark.errors import TidemarkError
from tidemark.event import TableId
from tidemark.source.signals import (
    SIGNAL_TYPES,
    ExecuteSnapshot,
    LogSignal,
    PauseSnapshot,
    ResumeSnapshot,
    SignalError,
    StopSnapshot,
    execute_snapshot_data,
    parse_signal,
    parse_table_name,
    send_signal,
    signal_table_ddl,
)

SIGNALS = TableId("public", "dbz_signal")
ORDERS = TableId("public", "orders")


def _table(name: str) -> TableId:
    schema, table = name.split(".")
    return TableId(schema, table)


# -- parse_signal: Debezium's documented signals, verbatim ------------------------------
def test_issue_example_incremental_snapshot() -> None:
    signal = parse_signal("ad-hoc-1", "execute-snapshot",
                          '{"data-collections": ["public.orders"], "type": "incremental"}')
    assert signal == ExecuteSnapshot(id="ad-hoc-1", data_collections=(ORDERS,),
                                     additional_conditions={}, surrogate_key=None,
                                     snapshot_type="incremental")


def test_debezium_example_without_type_is_incremental() -> None:
    signal = parse_signal("d139b9b7-7777-4547-917d-e1775ea61d41", "execute-snapshot",
                          '{"data-collections": ["public.MyFirstTable", '
                          '"public.MySecondTable"]}')
    assert isinstance(signal, ExecuteSnapshot)
    assert signal.id == "d139b9b7-7777-4547-917d-e1775ea61d41"
    # Order and case are kept: the names are matched with the catalog's exactly.
    assert signal.data_collections == (_table("public.MyFirstTable"),
                                       _table("public.MySecondTable"))
    assert signal.snapshot_type == "incremental"


def test_debezium_example_with_additional_conditions() -> None:
    data = ('{"data-collections": ["public.MyFirstTable"], "type": "INCREMENTAL", '
            '"additional-conditions":[{"data-collection": "public.MyFirstTable", '
            '"filter":"color=\'blue\' AND brand=\'MyBrand\'"}]}')
    signal = parse_signal("ad-hoc-1", "execute-snapshot", data)
    assert isinstance(signal, ExecuteSnapshot)
    assert signal.snapshot_type == "incremental"  # Debezium's type is case-insensitive
    assert signal.additional_conditions == {
        _table("public.MyFirstTable"): "color='blue' AND brand='MyBrand'"}


def test_debezium_example_products_filter_is_kept_raw() -> None:
    data = ('{"data-collections": ["schema1.products"],"type":"incremental", '
            '"additional-conditions":[{"data-collection": "schema1.products", '
            '"filter": "color=blue AND quantity>10"}]}')
    signal = parse_signal("ad-hoc-1", "execute-snapshot", data)
    assert isinstance(signal, ExecuteSnapshot)
    assert signal.additional_conditions == {
        _table("schema1.products"): "color=blue AND quantity>10"}


def test_surrogate_key() -> None:
    data = ('{"data-collections": ["schema1.table1", "schema2.table2"], '
            '"type":"incremental", "surrogate-key":"customer_id"}')
    signal = parse_signal("ad-hoc-1", "execute-snapshot", data)
    assert isinstance(signal, ExecuteSnapshot)
    assert signal.surrogate_key == "customer_id"
    assert signal.data_collections == (_table("schema1.table1"), _table("schema2.table2"))


def test_empty_surrogate_key_means_none_as_in_debezium() -> None:
    signal = parse_signal("s", "execute-snapshot",
                          '{"data-collections": ["orders"], "surrogate-key": ""}')
    assert isinstance(signal, ExecuteSnapshot)
    assert signal.surrogate_key is None


def test_table_without_schema_is_in_public_and_duplicates_are_one() -> None:
    signal = parse_signal("s", "execute-snapshot",
                          '{"data-collections": ["orders", "public.orders", "a.b"]}')
    assert isinstance(signal, ExecuteSnapshot)
    assert signal.data_collections == (ORDERS, TableId("a", "b"))


def test_condition_may_name_the_table_without_its_schema() -> None:
    signal = parse_signal("s", "execute-snapshot",
                          '{"data-collections": ["public.orders"], "additional-conditions": '
                          '[{"data-collection": "orders", "filter": "id > 10"}]}')
    assert isinstance(signal, ExecuteSnapshot)
    assert signal.additional_conditions == {ORDERS: "id > 10"}


def test_debezium_stop_snapshot_example() -> None:
    signal = parse_signal("d139b9b7-7777-4547-917d-e1775ea61d41", "stop-snapshot",
                          '{"type":"INCREMENTAL", "data-collections": ["public.MyFirstTable"]}')
    assert signal == StopSnapshot(id="d139b9b7-7777-4547-917d-e1775ea61d41",
                                  data_collections=(_table("public.MyFirstTable"),))


@pytest.mark.parametrize("data", [None, "", '{"type": "incremental"}',
                                  '{"data-collections": []}'])
def test_stop_snapshot_without_tables_stops_all(data: str | None) -> None:
    assert parse_signal("s", "stop-snapshot", data) == StopSnapshot(id="s",
                                                                    data_collections=())


@pytest.mark.parametrize("data", [None, "", "{}", '{"type": "INCREMENTAL", "x": 1}'])
def test_pause_and_resume_ignore_their_data(data: str | None) -> None:
    # Debezium: "The data field is ignored."
    assert parse_signal("p", "pause-snapshot", data) == PauseSnapshot(id="p")
    assert parse_signal("r", "resume-snapshot", data) == ResumeSnapshot(id="r")


def test_debezium_log_example() -> None:
    signal = parse_signal("924e3ff8-2245-43ca-ba77-2af9af02fa07", "log",
                          '{"message": "Signal message at offset {}"}')
    assert signal == LogSignal(id="924e3ff8-2245-43ca-ba77-2af9af02fa07",
                               message="Signal message at offset {}")


def test_signals_are_frozen() -> None:
    signal = parse_signal("s", "pause-snapshot", None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        signal.id = "other"  # type: ignore[misc]


# -- parse_signal: what is refused, and that the message says why -----------------------
def _refusal(signal_type: str, data: str | None, signal_id: str = "bad-1") -> str:
    with pytest.raises(SignalError) as info:
        parse_signal(signal_id, signal_type, data)
    message = str(info.value)
    assert repr(signal_id) in message  # every message names the signal
    return message


def test_unknown_type_lists_the_allowed_ones() -> None:
    message = _refusal("execute_snapshot", '{"data-collections": ["public.orders"]}')
    assert "unknown signal type 'execute_snapshot'" in message
    for allowed in SIGNAL_TYPES:
        assert allowed in message


def test_debezium_type_tidemark_does_not_take_says_why() -> None:
    message = _refusal("snapshot-window-open", None)
    assert "'snapshot-window-open' is not supported" in message
    assert "logical decoding messages" in message
    assert "execute-snapshot" in message


def test_blocking_snapshot_is_refused() -> None:
    # Debezium's blocking-snapshot example, verbatim.
    data = ('{"type": "blocking", "data-collections": ["schema1.table1", "schema1.table2"], '
            '"additional-conditions": [{"data-collection": "schema1.table1", "filter": '
            '"SELECT * FROM [schema1].[table1] WHERE column1 = 0 ORDER BY column2 DESC"}, '
            '{"data-collection": "schema1.table2", "filter": '
            '"SELECT * FROM [schema1].[table2] WHERE column2 > 0"}]}')
    message = _refusal("execute-snapshot", data)
    assert 'type "blocking" is not supported' in message
    assert '"incremental"' in message


@pytest.mark.parametrize(("signal_type", "data", "expected"), [
    # data that is not JSON, or not an object
    ("execute-snapshot", '{"data-collections": [', "data is not JSON"),
    ("execute-snapshot", "data-collections=public.orders", "data is not JSON"),
    ("pause-snapshot", "{oops", "data is not JSON"),
    ("execute-snapshot", '["public.orders"]', "data must be a JSON object ({...}), got a list"),
    ("execute-snapshot", '"public.orders"', "data must be a JSON object ({...}), got a string"),
    ("log", "42", "data must be a JSON object ({...}), got a number (42)"),
    ("execute-snapshot", '{"data-collections": ["a"], "data-collections": ["b"]}',
     "data has the key 'data-collections' twice"),
    # data-collections
    ("execute-snapshot", None, "data-collections is missing"),
    ("execute-snapshot", "{}", "data-collections is missing"),
    ("execute-snapshot", '{"type": "incremental"}', "data-collections is missing"),
    ("execute-snapshot", '{"data-collections": null}', "data-collections is missing"),
    ("execute-snapshot", '{"data-collections": []}', "data-collections is empty"),
    ("execute-snapshot", '{"data-collections": "public.orders"}',
     "data-collections must be a list of table names, got a string"),
    ("execute-snapshot", '{"data-collections": ["public.orders", 7]}',
     "data-collections[1] must be a table name (a string), got a number (7)"),
    ("stop-snapshot", '{"data-collections": {"public.orders": 1}}',
     "data-collections must be a list of table names, got an object"),
    # keys and types
    ("execute-snapshot", '{"data-collection": ["public.orders"]}',
     "unknown key 'data-collection'; the keys allowed are: data-collections, type, "
     "additional-conditions, surrogate-key"),
    ("execute-snapshot", '{"data-collections": ["public.orders"], '
                         '"additional-condition": "id > 1"}',
     "unknown key 'additional-condition' (Debezium's old form"),
    ("execute-snapshot", '{"data-collections": ["public.orders"], "type": "full"}',
     "unknown snapshot type 'full'"),
    ("execute-snapshot", '{"data-collections": ["public.orders"], "type": 1}',
     "type must be a string, got a number (1)"),
    ("stop-snapshot", '{"type": "blocking"}', 'type "blocking" is not supported'),
    ("stop-snapshot", '{"tables": ["public.orders"]}', "unknown key 'tables'"),
    # additional-conditions
    ("execute-snapshot", '{"data-collections": ["public.orders"], "additional-conditions": '
                         '[{"data-collection": "public.customers", "filter": "id > 1"}]}',
     "additional-conditions[0] is for public.customers, which is not in data-collections "
     "(public.orders)"),
    ("execute-snapshot", '{"data-collections": ["public.orders"], "additional-conditions": '
                         '[{"data-collection": "public.orders", "filter": ""}]}',
     "additional-conditions[0].filter must be a non-empty SQL condition"),
    ("execute-snapshot", '{"data-collections": ["public.orders"], "additional-conditions": '
                         '[{"data-collection": "public.orders", "filter": "  "}]}',
     "additional-conditions[0].filter must be a non-empty SQL condition"),
    ("execute-snapshot", '{"data-collections": ["public.orders"], "additional-conditions": '
                         '[{"data-collection": "public.orders"}]}',
     "additional-conditions[0].filter must be a non-empty SQL condition such as "
     "\"status = 'open'\", got null"),
    ("execute-snapshot", '{"data-collections": ["public.orders"], "additional-conditions": '
                         '[{"filter": "id > 1"}]}',
     "additional-conditions[0].data-collection must be a table name (a string), got null"),
    ("execute-snapshot", '{"data-collections": ["public.orders"], "additional-conditions": '
                         '[{"data-collection": "public.orders", "filter": "id > 1"}, '
                         '{"data-collection": "orders", "filter": "id < 9"}]}',
     "additional-conditions[1]: public.orders has a condition already"),
    ("execute-snapshot", '{"data-collections": ["public.orders"], "additional-conditions": '
                         '{"public.orders": "id > 1"}}',
     'additional-conditions must be a list like [{"data-collection": "schema.table", '
     '"filter": "<SQL condition>"}], got an object'),
    ("execute-snapshot", '{"data-collections": ["public.orders"], "additional-conditions": '
                         '["id > 1"]}',
     "additional-conditions[0] must be an object"),
    ("execute-snapshot", '{"data-collections": ["public.orders"], "additional-conditions": '
                         '[{"data-collection": "public.orders", "filter": "id > 1", '
                         '"where": "x"}]}',
     "additional-conditions[0] has the unknown key 'where'"),
    ("execute-snapshot", '{"data-collections": ["public.orders"], "additional-conditions": '
                         '[{"data-collection": "public.orders; DROP TABLE x", '
                         '"filter": "true"}]}',
     "additional-conditions[0].data-collection: 'public.orders; DROP TABLE x' is not a "
     "valid schema.table name: the table name contains ';'"),
    # surrogate-key
    ("execute-snapshot", '{"data-collections": ["public.orders"], "surrogate-key": 5}',
     "surrogate-key must be a column name (a string), got a number (5)"),
    ("execute-snapshot", '{"data-collections": ["public.orders"], '
                         '"surrogate-key": "id; DROP TABLE x"}',
     "surrogate-key: 'id; DROP TABLE x' is not a valid column name: it contains ';'"),
    ("execute-snapshot", '{"data-collections": ["public.orders"], '
                         '"surrogate-key": "\\"id\\""}',
     "surrogate-key: '\"id\"' is not a valid column name: it contains a quote"),
    # log
    ("log", None, 'message is missing: give the text to log, e.g. {"message": "hello"}'),
    ("log", '{"message": ""}', "message must be a non-empty string"),
    ("log", '{"message": ["a"]}', "message must be a non-empty string, e.g. "
                                  '{"message": "hello"}, got a list'),
    ("log", '{"msg": "hello"}', "unknown key 'msg'; the keys allowed are: message"),
])
def test_malformed_signal_says_what_is_wrong(signal_type: str, data: str | None,
                                             expected: str) -> None:
    assert expected in _refusal(signal_type, data)


# Names that are not schema.table, above all those that would change SQL built with them
# (they are quoted as well, but are refused before they get that far).
@pytest.mark.parametrize(("name", "expected"), [
    ("public.t; DROP TABLE x", "the table name contains ';'"),
    ("public.t;", "the table name contains ';'"),
    ('"public"."t"', "the schema name contains a quote (\"); write names without quotes"),
    ('public."T"', "the table name contains a quote"),
    ("public.t'", "the table name contains a quote (')"),
    ("public.`t`", "the table name contains a quote (`)"),
    ("public.t--", "the table name contains '-'"),
    ("public.t/*x*/", "the table name contains '/'"),
    ("public.t)", "the table name contains ')'"),
    ("public.t x", "the table name contains whitespace or a control character (' ')"),
    (" public.t", "the schema name contains whitespace or a control character (' ')"),
    ("public.t\n", "the table name contains whitespace or a control character ('\\n')"),
    ("public.t\x00", "the table name contains whitespace or a control character ('\\x00')"),
    ("public.t\u200b", "the table name contains whitespace or a control character"),
    ("public.t\u00a0", "the table name contains whitespace or a control character"),
    ("public.*", "contains '*'; tidemark takes table names, not Debezium's regular "
                 "expressions"),
    ("public.orders|customers", "contains '|'; tidemark takes table names"),
    ("db.public.t", "has more than two parts; expected schema.table"),
    ("public.", "the table name is empty"),
    (".t", "the schema name is empty"),
    ("", "the table name is empty"),
    ("1t", "the table name starts with '1'"),
    ("public.$t", "the table name starts with '$'"),
    ("public." + "t" * 64, "is 64 bytes long; PostgreSQL would cut it to 63"),
])
def test_bad_table_names_are_refused(name: str, expected: str) -> None:
    message = _refusal("execute-snapshot", json.dumps({"data-collections": [name]}))
    assert f"data-collections[0]: {name!r} " in message
    assert expected in message
    # ... and what is allowed
    assert "names are made of letters, digits, _ and $" in message or "two parts" in message
    with pytest.raises(SignalError, match=re.escape(expected)):
        parse_signal("stop-1", "stop-snapshot", json.dumps({"data-collections": [name]}))


@pytest.mark.parametrize("name", ["public.orders", "orders", "Sales.Order_Lines",
                                  "s$1.t$2", "_x._y", "café.crème", "public." + "t" * 63])
def test_good_table_names(name: str) -> None:
    table = parse_table_name(name)
    assert str(table) == (name if "." in name else f"public.{name}")


# -- the signal table -------------------------------------------------------------------
def test_signal_table_ddl() -> None:
    assert signal_table_ddl(SIGNALS) == (
        'CREATE TABLE IF NOT EXISTS "public"."dbz_signal" (id varchar(42) PRIMARY KEY, '
        "type varchar(32) NOT NULL, data varchar(2048) NULL)")
    # Quoted as PostgreSQL quotes identifiers, whatever the name holds.
    assert signal_table_ddl(TableId('we"ird', "Sig nals")).startswith(
        'CREATE TABLE IF NOT EXISTS "we""ird"."Sig nals" (')


def test_signal_table_ddl_creates_debeziums_layout(db: Database) -> None:
    db.execute(signal_table_ddl(SIGNALS), signal_table_ddl(SIGNALS))  # idempotent
    columns = db.query(
        "SELECT column_name, data_type, character_maximum_length, is_nullable "
        "FROM information_schema.columns WHERE table_name = 'dbz_signal' "
        "ORDER BY ordinal_position")
    assert columns == [("id", "character varying", 42, "NO"),
                       ("type", "character varying", 32, "NO"),
                       ("data", "character varying", 2048, "YES")]
    # A Debezium user's signal, as the issue writes it, goes in and parses.
    db.execute("INSERT INTO dbz_signal VALUES ('ad-hoc-1', 'execute-snapshot', "
               "'{\"data-collections\": [\"public.orders\"], \"type\": \"incremental\"}')")
    (row,) = db.query("SELECT id, type, data FROM dbz_signal")
    assert parse_signal(*row) == ExecuteSnapshot(id="ad-hoc-1", data_collections=(ORDERS,))


# -- send_signal ------------------------------------------------------------------------
def _rows(db: Database) -> list[tuple[str, str, str | None]]:
    return [(i, t, d) for i, t, d in db.query("SELECT id, type, data FROM dbz_signal")]


def test_send_signal_writes_the_row(db: Database) -> None:
    db.execute(signal_table_ddl(SIGNALS))
    data = execute_snapshot_data([ORDERS, "public.customers"],
                                 {"public.orders": "status = 'open'"}, "order_no")
    signal_id = send_signal(db.dsn, "public.dbz_signal", "execute-snapshot", data)
    assert re.fullmatch(r"[0-9a-f]{32}", signal_id)
    ((row_id, row_type, row_data),) = _rows(db)
    assert (row_id, row_type) == (signal_id, "execute-snapshot")
    assert row_data is not None
    assert json.loads(row_data) == {
        "data-collections": ["public.orders", "public.customers"], "type": "incremental",
        "additional-conditions": [{"data-collection": "public.orders",
                                   "filter": "status = 'open'"}],
        "surrogate-key": "order_no"}
    assert parse_signal(row_id, row_type, row_data) == ExecuteSnapshot(
        id=signal_id, data_collections=(ORDERS, TableId("public", "customers")),
        additional_conditions={ORDERS: "status = 'open'"}, surrogate_key="order_no")


def test_send_signal_with_an_id_and_no_data(db: Database) -> None:
    db.execute(signal_table_ddl(SIGNALS))
    assert send_signal(db.dsn, SIGNALS, "pause-snapshot", None, signal_id="pause-1") == "pause-1"
    assert _rows(db) == [("pause-1", "pause-snapshot", None)]


def test_send_signal_refuses_a_bad_signal_before_connecting(db: Database) -> None:
    db.execute(signal_table_ddl(SIGNALS))
    # A DSN nothing listens on: a refusal that came after connecting would be a
    # connection error instead.
    nowhere = "host=127.0.0.1 port=1 dbname=x connect_timeout=1"
    bad = [
        ("execute-snapshot", {"data-collections": ["public.t; DROP TABLE x"]}, None,
         "contains ';'"),
        ("execute-snapshot", {"data-collections": []}, None, "data-collections is empty"),
        ("snapshot", {"data-collections": ["public.orders"]}, None, "unknown signal type"),
        ("log", {"message": float("nan")}, None, "cannot be written as JSON"),
        ("pause-snapshot", None, "x" * 43, "must be 1 to 42 characters long"),
        ("pause-snapshot", None, "", "must be 1 to 42 characters long"),
        ("pause-snapshot", None, "a\nb", "contains a control character"),
    ]
    for signal_type, data, signal_id, expected in bad:
        with pytest.raises(SignalError, match=re.escape(expected)):
            send_signal(nowhere, SIGNALS, signal_type, data, signal_id=signal_id)
        with pytest.raises(SignalError, match=re.escape(expected)):
            send_signal(db.dsn, SIGNALS, signal_type, data, signal_id=signal_id)
    for table in ("public.dbz_signal; DROP TABLE x", '"public"."dbz_signal"',
                  TableId("public", "dbz signal")):
        with pytest.raises(SignalError, match=r"signal table: .* is not a valid schema\.table"):
            send_signal(nowhere, table, "pause-snapshot", None)
    assert _rows(db) == []


def test_send_signal_to_a_missing_table_says_how_to_create_it(db: Database) -> None:
    with pytest.raises(SignalError) as info:
        send_signal(db.dsn, "public.dbz_signal", "resume-snapshot", None)
    message = str(info.value)
    assert "signal table public.dbz_signal does not exist" in message
    assert signal_table_ddl(SIGNALS) in message
    with pytest.raises(SignalError, match="does not exist"):
        send_signal(db.dsn, "nosuchschema.dbz_signal", "resume-snapshot", None)


def test_send_signal_with_a_taken_id(db: Database) -> None:
    db.execute(signal_table_ddl(SIGNALS))
    send_signal(db.dsn, SIGNALS, "log", {"message": "one"}, signal_id="same")
    with pytest.raises(SignalError, match="has a signal with id 'same' already"):
        send_signal(db.dsn, SIGNALS, "log", {"message": "two"}, signal_id="same")


def test_send_signal_too_long_for_debeziums_layout(db: Database) -> None:
    db.execute(signal_table_ddl(SIGNALS))
    with pytest.raises(SignalError, match=r"does not fit signal table .* holds 2048"):
        send_signal(db.dsn, SIGNALS, "log", {"message": "x" * 3000})


def test_send_signal_to_a_table_of_another_layout(db: Database) -> None:
    db.execute("CREATE TABLE dbz_signal (signal_id text PRIMARY KEY, kind text, body text)")
    with pytest.raises(SignalError, match="does not have Debezium's layout"):
        send_signal(db.dsn, SIGNALS, "pause-snapshot", None)


def test_send_signal_without_insert_privilege_says_what_to_grant(db: Database) -> None:
    role, password = f"{db.name}_reader", "Sign4l-pw-2b7e"
    db.execute(signal_table_ddl(SIGNALS),
               f"CREATE ROLE {role} LOGIN PASSWORD '{password}'",
               f"GRANT CONNECT ON DATABASE {db.name} TO {role}")
    try:
        dsn = db.cluster.dsn(db.name, user=role, password=password)
        with pytest.raises(SignalError) as no_schema:
            send_signal(dsn, SIGNALS, "pause-snapshot", None)
        db.execute(f"GRANT USAGE ON SCHEMA public TO {role}",
                   f"GRANT SELECT ON dbz_signal TO {role}")
        with pytest.raises(SignalError) as no_insert:
            send_signal(dsn, SIGNALS, "pause-snapshot", None)
    finally:
        db.execute(f"DROP OWNED BY {role}", f"DROP ROLE {role}")
    for err in (no_schema.value, no_insert.value):
        message = str(err)
        assert f'"{role}" may not insert into signal table public.dbz_signal' in message
        assert f'GRANT INSERT ON "public"."dbz_signal" TO "{role}"' in message
        assert password not in message
    assert 'GRANT USAGE ON SCHEMA "public"' in str(no_schema.value)
    assert _rows(db) == []


# -- tidemark signal --------------------------------------------------------------------
def _cli(db: Database, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TIDEMARK_DSN": db.dsn}
    return subprocess.run([sys.executable, "-m", "tidemark", "signal", *args],
                          capture_output=True, text=True, timeout=60, env=env, check=False)


def test_cli_execute_snapshot_writes_the_row(db: Database) -> None:
    db.execute(signal_table_ddl(SIGNALS))
    done = _cli(db, "execute-snapshot", "public.orders", "--signal-table", "public.dbz_signal")
    assert done.returncode == 0, done.stderr
    signal_id = done.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", signal_id)
    ((row_id, row_type, row_data),) = _rows(db)
    assert (row_id, row_type) == (signal_id, "execute-snapshot")
    assert row_data is not None
    assert json.loads(row_data) == {"data-collections": ["public.orders"],
                                    "type": "incremental"}


def test_cli_execute_snapshot_with_conditions_key_and_id(db: Database) -> None:
    db.execute(signal_table_ddl(SIGNALS))
    done = _cli(db, "execute-snapshot", "public.orders", "customers",
                "--condition", "public.orders=status = 'open' AND total > 10",
                "--condition", "customers = country = 'NZ'",
                "--surrogate-key", "order_no", "--id", "ad-hoc-7",
                "--signal-table", "public.dbz_signal", "--dsn", db.dsn)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ad-hoc-7\n"
    ((row_id, row_type, row_data),) = _rows(db)
    assert row_data is not None
    assert parse_signal(row_id, row_type, row_data) == ExecuteSnapshot(
        id="ad-hoc-7", data_collections=(ORDERS, TableId("public", "customers")),
        additional_conditions={ORDERS: "status = 'open' AND total > 10",
                               TableId("public", "customers"): " country = 'NZ'"},
        surrogate_key="order_no")


@pytest.mark.parametrize(("args", "expected_type", "expected_data"), [
    (("stop-snapshot",), "stop-snapshot", {"type": "incremental"}),
    (("stop-snapshot", "public.orders", "a.b"), "stop-snapshot",
     {"type": "incremental", "data-collections": ["public.orders", "a.b"]}),
    (("pause-snapshot",), "pause-snapshot", None),
    (("resume-snapshot",), "resume-snapshot", None),
    (("log", "hello {}"), "log", {"message": "hello {}"}),
])
def test_cli_other_signals(db: Database, args: tuple[str, ...], expected_type: str,
                           expected_data: dict[str, object] | None) -> None:
    db.execute(signal_table_ddl(SIGNALS))
    done = _cli(db, *args, "--signal-table", "public.dbz_signal")
    assert done.returncode == 0, done.stderr
    ((row_id, row_type, row_data),) = _rows(db)
    assert (row_id, row_type) == (done.stdout.strip(), expected_type)
    assert (None if row_data is None else json.loads(row_data)) == expected_data


def test_cli_missing_signal_table_exits_2_with_the_ddl(db: Database) -> None:
    done = _cli(db, "execute-snapshot", "public.orders", "--signal-table", "public.dbz_signal")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("error: signal table public.dbz_signal does not exist")
    assert signal_table_ddl(SIGNALS) in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("args", "expected"), [
    (("execute-snapshot", "public.orders; DROP TABLE dbz_signal"), "contains ';'"),
    (("execute-snapshot", '"public"."orders"'), "contains a quote"),
    (("execute-snapshot", "public.orders--"), "contains '-'"),
    (("stop-snapshot", "db.public.orders"), "has more than two parts"),
    (("execute-snapshot", "public.orders", "--condition", "public.customers=id > 1"),
     "public.customers, which is not in data-collections"),
    # The table left out: "id >" is taken for it.
    (("execute-snapshot", "public.orders", "--condition", "id >= 1"),
     "'id >' is not a valid schema.table name"),
    (("execute-snapshot", "public.orders", "--condition", "public.orders"),
     "expected TABLE=FILTER"),
    (("execute-snapshot", "public.orders", "--condition", "orders=a", "--condition",
      "orders=b"), "--condition is given twice for orders"),
    (("execute-snapshot", "public.orders", "--surrogate-key", "id desc"),
     "surrogate-key: 'id desc' is not a valid column name"),
    (("log", ""), "message must be a non-empty string"),
    (("pause-snapshot", "--id", "x" * 43), "must be 1 to 42 characters long"),
])
def test_cli_refuses_a_bad_signal_before_writing(db: Database, args: tuple[str, ...],
                                                 expected: str) -> None:
    db.execute(signal_table_ddl(SIGNALS))
    done = _cli(db, *args, "--signal-table", "public.dbz_signal")
    assert done.returncode == 2
    assert done.stderr.startswith("error: ")
    assert expected in done.stderr
    assert _rows(db) == []


def test_cli_bad_signal_table_name(db: Database) -> None:
    done = _cli(db, "pause-snapshot", "--signal-table", "public.dbz_signal;")
    assert done.returncode == 2
    assert done.stderr.startswith("error: signal table: 'public.dbz_signal;' is not a valid")


def test_cli_needs_a_signal_table_and_a_table(db: Database) -> None:
    done = _cli(db, "execute-snapshot", "public.orders")
    assert done.returncode == 2
    assert "--signal-table" in done.stderr
    done = _cli(db, "execute-snapshot", "--signal-table", "public.dbz_signal")
    assert done.returncode == 2
    assert "TABLE" in done.stderr


def test_signal_error_is_a_tidemark_error() -> None:
    assert issubclass(SignalError, TidemarkError)
