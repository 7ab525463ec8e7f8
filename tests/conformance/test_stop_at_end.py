"""``tidemark capture --stop-at-end`` beside a writer that never pauses, on every
source: it stops once everything committed before it started is handed on. (It used to
wait for an idle read, which a steady writer never leaves it, and ran until killed.)"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conformance.sources import SOURCES, SourceUnderTest, make_source

pytestmark = pytest.mark.integration

_BEFORE = 100  # rows committed before the capture starts
_DEADLINE_S = 60
_WRITERS = 4  # writers that never pause, each on a connection of its own


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest, tmp_path: Path) -> SourceUnderTest:
    # Many groups for log tables: a pass that finds every group empty grows rare.
    return make_source(request.param, request, tmp_path, log_groups=64)


def test_stop_at_end_stops_beside_a_steady_writer(source: SourceUnderTest,
                                                  tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "tidemark", "capture", "--dsn", source.dsn,
            "--offsets", str(tmp_path / "offsets.json"), *source.capture_args(),
            "--stop-at-end"]
    # The first run places the capture (a slot, a saved position) before the rows.
    subprocess.run(argv, check=True, capture_output=True, timeout=_DEADLINE_S)
    source.execute(*(source.insert(i) for i in range(1, _BEFORE + 1)))
    stop = threading.Event()
    writers = [threading.Thread(target=_write, args=(source, stop, n), daemon=True)
               for n in range(_WRITERS)]
    for writer in writers:
        writer.start()
    try:
        done = subprocess.run(argv, check=False, capture_output=True, text=True,
                              timeout=_DEADLINE_S)
    finally:
        stop.set()
        for writer in writers:
            writer.join(timeout=30)
    assert done.returncode == 0, done.stderr[-3000:]
    ids = {_key(line) for line in done.stdout.splitlines() if line.startswith("{")}
    assert set(range(1, _BEFORE + 1)) <= ids  # everything committed before the start


def _write(source: SourceUnderTest, stop: threading.Event, n: int) -> None:
    """A commit after another, each a row of its own (keys from *n* hundred thousand), until
    *stop*."""
    with contextlib.closing(source.connect()) as conn:
        cur = conn.cursor()
        i = (n + 1) * 100_000
        while not stop.is_set():
            i += 1
            sql, params = source.insert(i)
            cur.execute(sql, tuple(params))
            conn.commit()


def _key(line: str) -> object:
    value = json.loads(line)["value"]
    if value is None:
        return None
    row = value.get("after") or value.get("before") or {}
    return row.get("id")
