"""The initial snapshot reads tables in the include list's order, as Debezium's
RelationalSnapshotChangeEventSource does (``addSignalingCollectionAndSort``: each entry's
tables sorted by name, in the list's order), and marks ``source.snapshot`` ``first`` on
the first table's first row and ``last`` on the last table's last row."""

from __future__ import annotations

import json
from typing import Any

import pytest

from capture_helpers import drain, make_connector
from conftest import Database, MariaDatabase
from mariadb_helpers import capture, values
from tidemark.event import ChangeEvent
from tidemark.serde.debezium_json import DebeziumJsonOptions, DebeziumJsonSerializer
from tidemark.source.mariadb.config import MariaDbSourceConfig

# created in name order, listed in another: zeta first, then a pattern (its tables by
# name), then alpha
TABLES = ("alpha", "beta_1", "beta_2", "zeta")


def _postgres(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    db: Database = request.getfixturevalue("db")
    db.execute(*(f"CREATE TABLE {t} (id int PRIMARY KEY)" for t in TABLES),
               *(f"INSERT INTO {t} VALUES (1), (2)" for t in TABLES))
    connector = make_connector(db.dsn, "public.zeta", r"public\.beta_.*", "public.alpha",
                               snapshot_mode="initial_only")
    connector.start()
    try:
        records = drain(connector)
    finally:
        connector.stop()
    serializer = DebeziumJsonSerializer(DebeziumJsonOptions())
    rows = [json.loads(serializer.key_and_value(r)[1]) for r in records
            if isinstance(r, ChangeEvent)]
    return "public", rows


def _mariadb(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    mdb: MariaDatabase = request.getfixturevalue("mdb")
    mdb.execute(*(f"CREATE TABLE {t} (id INT PRIMARY KEY)" for t in TABLES),
                *(f"INSERT INTO {t} VALUES (1), (2)" for t in TABLES))
    name = mdb.name
    config = MariaDbSourceConfig.from_mapping({
        "dsn": mdb.dsn, "snapshot_mode": "initial_only",
        "table_include_list": [f"{name}\\.zeta", f"{name}\\.beta_.*", f"{name}\\.alpha"]})
    records, _ = capture(config)
    return name, values(records)


@pytest.mark.parametrize("source", ["postgres", "mariadb"])
def test_snapshot_follows_the_include_list_order(source: str,
                                                 request: pytest.FixtureRequest) -> None:
    _, rows = {"postgres": _postgres, "mariadb": _mariadb}[source](request)
    assert [(r["source"]["table"], r["after"]["id"]) for r in rows] == [
        (t, i) for t in ("zeta", "beta_1", "beta_2", "alpha") for i in (1, 2)]
    markers = [r["source"]["snapshot"] for r in rows]
    assert markers[0] == "first" and markers[-1] == "last"


def test_postgres_sorts_a_patterns_tables_by_their_full_name(db: Database) -> None:
    # Debezium sorts TableIds by their "schema.table" string: "o-x.t" before "o.t"
    # ('-' < '.'), though schema "o" sorts before schema "o-x".
    db.execute('CREATE SCHEMA o', 'CREATE SCHEMA "o-x"',
               'CREATE TABLE o.t (id int PRIMARY KEY)', 'CREATE TABLE "o-x".t (id int PRIMARY KEY)',
               'INSERT INTO o.t VALUES (1)', 'INSERT INTO "o-x".t VALUES (1)')
    connector = make_connector(db.dsn, r"o.*\.t", snapshot_mode="initial_only")
    connector.start()
    try:
        records = drain(connector)
    finally:
        connector.stop()
    assert [r.table.schema for r in records if isinstance(r, ChangeEvent)] == ["o-x", "o"]
