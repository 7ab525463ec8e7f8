"""Ctrl-C (and SIGTERM) of ``tidemark run`` in the middle of a batch, under load.

A batch runs in py4j's callback thread while delta-rs pulls its rows through Python from
native threads; the process must not end while it runs (that crashed the interpreter:
``Fatal Python error: PyGILState_Release`` or a segmentation fault). Here every batch
spills and is merged in steps of a few rows, so a batch lasts long enough that a signal
sent when it starts lands inside it: the first signal finishes the batch, then the
process exits (130 after SIGINT, 0 after SIGTERM); a second one stops at once. After
all the stops, a catch-up run makes Delta equal the source with no SCD2 version twice.
The same under real timing, many times: ``benchmarks/sigint_stress.py``.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import Database
from pipeline_helpers import (
    _assert_equal_to_source,
    _pipeline_file,
    _prepare,
    _tidemark_run,
    _wait_for_batches,
    _Writer,
)
from waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

_STARTED = re.compile(r"batch (\d+) spans .* applied in steps")


def _started_batches(log: Path) -> list[int]:
    return [int(m.group(1)) for m in _STARTED.finditer(log.read_text(errors="replace"))]


def _stop_in_a_batch(config: Path, log: Path, signals: list[signal.Signals]) -> tuple[
        int, str, int]:
    """Run the pipeline, send *signals* once a batch has started; its exit status, its
    output of this run, and the batch the signals landed in."""
    log.write_bytes(b"")
    proc = _tidemark_run(config, log, extra_env={"PYTHONFAULTHANDLER": "1"},
                         log_level="INFO")
    try:
        _wait_for_batches(log, 1, proc)
        seen = len(_started_batches(log))
        wait_for(lambda: _alive(proc, log) and len(_started_batches(log)) > seen, 60,
                 "a batch to start", interval_s=0.01)
        batch = _started_batches(log)[-1]
        for n, signum in enumerate(signals):
            proc.send_signal(signum)
            # Two signals sent at once would be one: the second waits for the first.
            if n + 1 < len(signals):
                wait_for(lambda: _alive(proc, log) and "stopping after" in log.read_text(
                    errors="replace"), 60, "the first signal to be taken", interval_s=0.01)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    return code, log.read_text(errors="replace"), batch


def test_a_signal_in_a_batch_under_load_finishes_it_and_exits_cleanly(
        db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(10, 2))",
               "CREATE TABLE b (id int PRIMARY KEY, v text)")
    # Batches of at most 200 changes, merged 20 rows at a time: about ten steps per
    # target, each a Delta merge.
    prepared = _prepare(db, "a", "b")
    source = prepared + f'dsn = "{db.dsn}"\nmaxChangesPerTrigger = 200\n'
    config = _pipeline_file(tmp_path, source, "trigger_interval_ms = 200\ncollect_max_mb = 0\n"
                            "apply_step_rows = 20", changelog=False)
    writer = _Writer(db.dsn, seed=6, limit=None, changes=4, pause_s=0.01)
    writer.start()
    try:
        for n, (signals, expected) in enumerate([
                ([signal.SIGINT], 130), ([signal.SIGTERM], 0),
                ([signal.SIGINT, signal.SIGINT], 130)]):
            code, output, batch = _stop_in_a_batch(config, tmp_path / f"run{n}.log", signals)
            assert "Fatal Python error" not in output and code >= 0, output[-3000:]
            assert code == expected, output[-3000:]
            name = signals[0].name
            assert f"{name}: stopping after the current batch" in output, output[-3000:]
            if len(signals) == 1:
                # The batch the signal landed in was applied, then nothing else started.
                assert re.search(rf"^batch {batch}: ", output, re.MULTILINE), output[-3000:]
                assert max(_started_batches(tmp_path / f"run{n}.log")) == batch
            else:
                assert f"{name}: stopping now" in output, output[-3000:]
            assert re.search(r"^stopped$", output, re.MULTILINE), output[-3000:]
    finally:
        writer.finish()
    # The catch-up reads what the writer left without the small batches and steps (at 200
    # changes a trigger it took most of the test's time).
    config = _pipeline_file(tmp_path, prepared + f'dsn = "{db.dsn}"\n', "", changelog=False)
    log = tmp_path / "catch_up.log"
    proc = _tidemark_run(config, log, "--available-now")
    assert proc.wait(300) == 0, log.read_text(errors="replace")[-3000:]
    _assert_equal_to_source(db, tmp_path)


def _alive(proc: subprocess.Popen[bytes], log: Path) -> bool:
    """True while *proc* runs (an AssertionError with the log's end once it ended)."""
    assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
    return True
