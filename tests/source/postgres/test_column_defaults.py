"""The values that rows older than an added column hold (``ADD COLUMN … DEFAULT``)."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import logging

import pytest

from conftest import Database
from tidemark.event import TableId
from tidemark.source.postgres.column_defaults import existing_row_values
from tidemark.testing.postgres import sql_connection

pytestmark = [pytest.mark.integration, pytest.mark.every_pg_version]


def _values(db: Database, columns: list[str]) -> dict[str, object]:
    with contextlib.closing(sql_connection(db.dsn)) as conn:
        return existing_row_values(conn, TableId("public", "t"), columns)


def test_constant_defaults_are_the_existing_rows_values(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)",
               "ALTER TABLE t ADD COLUMN a text DEFAULT 'it''s', ADD COLUMN b numeric(10,2) "
               "DEFAULT 1.5, ADD COLUMN c date DEFAULT '2020-01-02', ADD COLUMN d bool "
               "DEFAULT true, ADD COLUMN e text, ADD COLUMN f int DEFAULT NULL")
    assert _values(db, ["a", "b", "c", "d", "e", "f", "id"]) == {
        "a": "it's", "b": decimal.Decimal("1.50"), "c": "2020-01-02", "d": True}
    assert db.query("SELECT a, b, c, d FROM t") == [
        ("it's", decimal.Decimal("1.50"), dt.date(2020, 1, 2), True)]


def test_a_default_without_a_single_value_is_said_loudly(
        db: Database, caplog: pytest.LogCaptureFixture) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1), (2)",
               "ALTER TABLE t ADD COLUMN r float8 DEFAULT random()")
    with caplog.at_level(logging.WARNING):
        assert _values(db, ["r"]) == {}
    assert "public.t gained column 'r' with DEFAULT random()" in caplog.text
    assert "read null in the target" in caplog.text
