"""``tidemark capture --stop-at-end`` beside a writer that never pauses: it stops once
everything committed before it started is handed on (it used to wait for an idle read,
which a steady writer never leaves it, and ran until killed)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading

import psycopg
import pytest

from conftest import Database

pytestmark = pytest.mark.every_pg_version


def test_stop_at_end_stops_beside_a_steady_writer(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    env = {**os.environ, "TIDEMARK_DSN": db.dsn}
    argv = [sys.executable, "-m", "tidemark", "capture", "--table", "public.t",
            "--snapshot-mode", "no_data", "--stop-at-end"]
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=60)  # the slot
    db.execute("INSERT INTO t SELECT g FROM generate_series(1, 100) AS g")
    writer = psycopg.connect(db.dsn, autocommit=True)
    # A commit every millisecond or so, flushed at once as on a durable server, from
    # the server itself (no client pauses), until cancelled.
    loop = threading.Thread(target=_write, args=(writer,), daemon=True)
    loop.start()
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90,
                              check=False)
    finally:
        writer.cancel_safe()
        loop.join(timeout=30)
        writer.close()
    assert done.returncode == 0, done.stderr[-2000:]
    ids = {json.loads(line)["value"]["after"]["id"] for line in done.stdout.splitlines()
           if line.startswith("{") and json.loads(line)["value"] is not None}
    assert set(range(1, 101)) <= ids  # everything committed before the start


def _write(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    with contextlib.suppress(psycopg.Error):
        conn.execute("SET synchronous_commit = on")
        conn.execute("""
            DO $$ BEGIN
                FOR i IN 1001 .. 1000000 LOOP
                    INSERT INTO t VALUES (i); COMMIT; PERFORM pg_sleep(0.001);
                END LOOP;
            END $$""")
