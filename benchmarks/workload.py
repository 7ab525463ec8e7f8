"""The shared benchmark workload: table ``t10`` and 300,000 changes.

3,000 transactions of 100 changes each: 60 inserts, then 30 updates and 10 deletes of
rows inserted by the same transaction (so every transaction has exactly 100 changes),
generated server-side so that building it takes seconds, not minutes.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from tidemark.testing.postgres import sql_connection

T10_DDL = """
CREATE TABLE IF NOT EXISTS t10 (
    id bigint PRIMARY KEY,
    c_int integer,
    c_bigint bigint,
    c_text text,
    c_numeric numeric(12, 2),
    c_ts timestamptz,
    c_bool boolean,
    c_label text,
    c_double double precision,
    c_date date
)
"""

def t10_insert(first: object, last: object) -> str:
    """SQL inserting the ``t10`` rows with ids *first* to *last* (numbers, or SQL
    expressions), the same values for an id every time."""
    return f"""
INSERT INTO t10
SELECT g, g % 1000, g::bigint * 1000003, 'row ' || lpad(g::text, 16, '0'),
       (g % 100000) / 100.0, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second',
       g % 2 = 0, 'label-' || (g % 97), g / 7.0, date '2024-01-01' + (g % 365)
FROM generate_series({first}, {last}) AS g"""


_WORKLOAD = f"""
DO $$
DECLARE
    i integer;
BEGIN
    FOR i IN 0 .. {{transactions}} - 1 LOOP
        {t10_insert("i * 60 + 1", "i * 60 + 60")};
        UPDATE t10 SET c_int = c_int + 1, c_label = 'updated', c_double = c_double * 2
        WHERE id BETWEEN i * 60 + 1 AND i * 60 + 30;
        DELETE FROM t10 WHERE id BETWEEN i * 60 + 31 AND i * 60 + 40;
        COMMIT;
    END LOOP;
END
$$
"""


#: ``t10`` filled with ids 1..{rows} (``.format(rows=N)``), the same values every time:
#: the table the snapshot benchmarks read.
T10_FILL = t10_insert(1, "{rows}")


def fill_t10(dsn: str, rows: int, *statements: str) -> None:
    """Create ``t10`` with ids 1..*rows*, run *statements*, then ``VACUUM ANALYZE``
    it (statistics and the visibility map set before anything is measured)."""
    create_table(dsn)
    with contextlib.closing(sql_connection(dsn)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(T10_FILL.format(rows=int(rows)))
            for statement in statements:
                cur.execute(statement)
            cur.execute("VACUUM ANALYZE t10")


def create_table(dsn: str) -> None:
    """Create ``t10`` (and nothing else)."""
    with contextlib.closing(sql_connection(dsn)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(T10_DDL)


def deletes(transactions: int) -> int:
    """How many of the changes of :func:`run_workload` are deletes (10 per transaction;
    each is followed by a tombstone in Debezium JSON, ``t10`` having a primary key)."""
    return transactions * 10


def run_workload(dsn: str, transactions: int = 3000) -> int:
    """Apply *transactions* transactions of 100 changes; returns the number of changes."""
    with contextlib.closing(sql_connection(dsn)) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(_WORKLOAD.format(transactions=int(transactions)))
    return transactions * 100


class PacedUpdates(threading.Thread):
    """Single-row UPDATEs of random ``t10`` rows, each its own transaction, paced at
    *rate*/s (a writer that falls behind does not sleep until it has caught up), on the
    autocommit DB-API connection *connect* opens (PostgreSQL or MariaDB)."""

    def __init__(self, connect: Callable[[], Any], rows: int, rate: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.connect, self.rows, self.rate = connect, rows, rate
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.done = 0
        self.seconds = 0.0

    def run(self) -> None:
        with contextlib.closing(self.connect()) as conn, conn.cursor() as cur:
            self.ready.set()
            started = time.perf_counter()
            while not self.stop.is_set():
                wait = started + self.done / self.rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                cur.execute("UPDATE t10 SET c_int = c_int + 1, c_label = 'updated' "
                            "WHERE id = %s", (self.rng.randint(1, self.rows),))
                self.done += 1
            self.seconds = time.perf_counter() - started

    @property
    def achieved(self) -> float:
        return self.done / self.seconds if self.seconds else 0.0
