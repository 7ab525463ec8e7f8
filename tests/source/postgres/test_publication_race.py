"""Engines started together on one publication that lacks their tables: each adds what
it needs, none fails because another added (or created) it first. Real concurrent
starts on threads, each with its own connection, released together by a barrier."""

from __future__ import annotations

import contextlib
import threading

import pytest

from conftest import Database
from tidemark.event import TableId
from tidemark.postgres_connection import connect
from tidemark.source.postgres import slot

STARTS = 4
ROUNDS = 15


def _published(db: Database, publication: str) -> set[str]:
    return {f"{s}.{t}" for s, t in db.query(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
        (publication,))}


def _start_together(db: Database, publication: str,
                    tables_of: list[list[TableId]]) -> list[BaseException]:
    """Run ensure_publication for each table list at once; the errors raised."""
    conns = [connect(db.dsn) for _ in tables_of]
    barrier = threading.Barrier(len(tables_of))
    errors: list[BaseException] = []

    def start(i: int) -> None:
        barrier.wait()
        try:
            slot.ensure_publication(conns[i], publication, tables_of[i])
        except BaseException as err:  # collected for the assertion
            errors.append(err)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(len(tables_of))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive(), "a start hung"
    finally:
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()
    return errors


@pytest.mark.parametrize("existing", [True, False],
                         ids=["publication lacks the tables", "no publication yet"])
def test_concurrent_starts_on_one_publication_all_succeed(db: Database,
                                                          existing: bool) -> None:
    tables = [f"t{i}" for i in range(STARTS)]
    db.execute("CREATE TABLE base (id int PRIMARY KEY)",
               *(f"CREATE TABLE {t} (id int PRIMARY KEY)" for t in tables))
    # Every start needs the shared table "shared" and one of its own.
    db.execute("CREATE TABLE shared (id int PRIMARY KEY)")
    for round_ in range(ROUNDS):
        publication = f"race_{round_}"
        if existing:
            db.execute(f"CREATE PUBLICATION {publication} FOR TABLE base")
        tables_of = [[TableId("public", "shared"), TableId("public", t)] for t in tables]
        errors = _start_together(db, publication, tables_of)
        assert not errors, f"round {round_}: {errors[0]!r}"
        expected = {"public.shared", *(f"public.{t}" for t in tables)}
        if existing:
            expected.add("public.base")
        assert _published(db, publication) == expected
