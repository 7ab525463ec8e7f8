"""The conformance matrix: every source (rows, :mod:`conformance.sources`) under every
runtime (columns, :mod:`conformance.runtimes`), each cell checked for

* ``round_trip``: every operation and every type of the matrix table, from the source
  through the runtime's own format and back, equals the source table (Debezium's own
  output is compared event by event in the sources' Debezium conformance tests:
  tests/source/postgres/test_debezium_conformance.py, tests/source/mariadb/
  test_mariadb_conformance.py);
* ``types``: every type of the source's list (:mod:`type_lists`, shared with the
  converters' agreement test) round trips, edge values and NULLs, through inserts,
  updates and a delete, each value compared in the runtime's documented representation
  (:mod:`conformance.type_columns`);
* ``sigkill``: the runtime killed with SIGKILL mid-stream and started again loses
  nothing: capture and the engine (a child process per converter,
  :mod:`conformance.engine_child`; it redelivers at most ``max_in_flight`` records),
  ``tidemark run`` at the fault point ``after_write`` (:mod:`tidemark.faults`: Delta
  holds the batch, Spark's commit log does not), after which no row is in Delta twice;
* ``server_restart``: the source's server restarted mid-stream, nothing is lost;
* ``big_transaction``: a transaction of 12.8 MB of 8 KB rows arrives whole; the engine,
  its batches bounded to 50 changes, holds its peak RSS (against a baseline after a
  transaction of 100 such rows);
* ``refusal``: an option the source does not have is refused at start, naming it
  (capture's flags, the engine connector's settings, the Spark source's options,
  ``pipeline.toml``'s ``[source]`` lines);
* ``debezium``: where Debezium has the source's connector (PostgreSQL, MariaDB) and the
  runtime writes Debezium JSON (capture, the engine's JSON converter), the runtime's
  records for the reference script equal Debezium 3.6.3's own, record by record
  (:mod:`conformance.debezium_cells`; the allowed differences are
  :mod:`debezium_comparison`'s, shared with the sources' conformance tests).

A cell that cannot hold is skipped with the reason (the matrix report prints it); the
terminal summary prints the whole matrix.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance.runtimes import (
    MAX_IN_FLIGHT,
    RUNTIMES,
    SPARK_RUNTIMES,
    EngineRunning,
    PipelineRunning,
    Running,
    Runtime,
    make_runtime,
    opened,
)
from conformance.sources import SOURCES, SourceUnderTest, make_source
from debezium_comparison import assert_same_as_debezium
from tidemark.errors import ConfigError
from waiting import wait_for

pytestmark = pytest.mark.integration

CHECKS = ("round_trip", "types", "sigkill", "server_restart", "big_transaction", "refusal",
          "debezium")


@pytest.fixture(params=SOURCES)
def source(request: pytest.FixtureRequest, tmp_path: Path) -> SourceUnderTest:
    return make_source(request.param, request, tmp_path,
                       typed=request.node.originalname == "test_types")


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> Runtime:
    spark = request.getfixturevalue("spark") if request.param in SPARK_RUNTIMES else None
    return make_runtime(request.param, spark)


def _open_stream(running: Running, source: SourceUnderTest) -> None:
    """Wait until the runtime sees a change: its stream is open (a slot, a binlog
    position, a query's start), so the workload after it is all streamed."""
    source.execute(source.insert(0))
    touches = iter(range(1, 10_000))

    def seen() -> bool:
        source.execute(source.update(0, f=float(next(touches))))
        return 0 in running.rows()

    wait_for(seen, 120, f"{source.name}: the stream to open", interval_s=0.2)


def _settled(running: Running, source: SourceUnderTest, what: str,
             timeout_s: float) -> None:
    """Wait until the runtime's rows equal the source's; fail showing the difference,
    or the runtime's own failure (a capture that exited: its stderr)."""
    expected = source.rows()
    last: list[object] = []
    failed: list[AssertionError] = []

    def equal() -> bool:
        try:
            got = running.rows()
        except AssertionError as err:  # the runtime ended: why, not a timeout
            failed.append(err)
            raise
        last[:] = [got]
        return got == expected

    try:
        wait_for(equal, timeout_s, f"{source.name}: {what}", interval_s=0.2)
    except AssertionError:
        if failed:
            raise AssertionError(f"{source.name}: {what}: the runtime failed: "
                                 f"{failed[0]}") from None
        got: Any = last[0] if last else {}
        differ = {k: _difference(got.get(k), expected.get(k))
                  for k in got.keys() | expected.keys() if got.get(k) != expected.get(k)}
        raise AssertionError(f"{source.name}: {what}: (runtime's row, source's row) by "
                             f"key: {differ}") from None


def _difference(got: Any, expected: Any) -> Any:
    """Two rows' differing columns, (runtime's, source's) by name; a missing row whole."""
    if not isinstance(got, dict) or not isinstance(expected, dict):
        return (got, expected)
    return {n: (got.get(n), expected.get(n)) for n in got.keys() | expected.keys()
            if got.get(n) != expected.get(n)}


#: Cells that fail today, by (source, runtime, check) ("*": every check), with why: each
#: an xfail(strict=True), so a fix turns the cell red until its entry is removed.
KNOWN_FAILURES: dict[tuple[str, str, str], str] = {
}


@dataclass(frozen=True)
class Cell:
    where: Path
    """Where the runtime keeps its state (offsets, checkpoint, output)."""
    patience_s: float
    """How long the cell waits for the runtime's rows to equal the source's."""


@pytest.fixture
def cell(request: pytest.FixtureRequest, source: SourceUnderTest, runtime: Runtime,
         tmp_path: Path) -> Iterator[Cell]:
    check = request.node.originalname.removeprefix("test_")
    reason = KNOWN_FAILURES.get((source.name, runtime.name, check))
    if check != "refusal":  # "*": every check of the rows, not the start's refusals
        reason = reason or KNOWN_FAILURES.get((source.name, runtime.name, "*"))
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    # A known failure shows in its first seconds: do not wait out the whole deadline.
    yield Cell(tmp_path / runtime.name, 5 if reason else 180)


def test_round_trip(source: SourceUnderTest, runtime: Runtime, cell: Cell) -> None:
    with opened(runtime, source, cell.where) as running:
        _open_stream(running, source)
        for transaction in source.workload():
            source.execute(*transaction)
        _settled(running, source, "the workload", cell.patience_s)


def test_types(source: SourceUnderTest, runtime: Runtime, cell: Cell) -> None:
    """Every type of the source's list (:mod:`type_lists`) round trips: rows of edge
    values and NULLs inserted, updated to NULLs and to values, deleted; the runtime's
    rows, read in its own format, equal the source's, each value in the runtime's
    documented representation (:mod:`conformance.type_columns`)."""
    with opened(runtime, source, cell.where) as running:
        touches = iter(range(100, 10_000))

        def seen() -> bool:  # the stream is open: a row of NULLs arrived
            source.execute(source.insert(next(touches), nulls=True))
            return bool(running.rows())

        wait_for(seen, 120, f"{source.name}: the stream to open", interval_s=0.5)
        # Rows made before the stream opened were never streamed: gone from both sides.
        source.execute("DELETE FROM mx WHERE id >= 100")
        for transaction in source.types_workload():
            source.execute(*transaction)
        # A few rows: equal within seconds (a passing cell takes 1-3 s), or never.
        _settled(running, source, "every type", min(cell.patience_s, 30))


def test_server_restart(source: SourceUnderTest, runtime: Runtime, cell: Cell) -> None:
    if source.restart_refusal:
        pytest.skip(source.restart_refusal)
    with opened(runtime, source, cell.where) as running:
        _open_stream(running, source)
        work = source.workload()
        for transaction in work[:3]:
            source.execute(*transaction)
        source.restart_server()
        for transaction in work[3:]:
            source.execute(*transaction)
        _settled(running, source, "the workload across a server restart", cell.patience_s)


#: The big transaction: wide rows, many times what the runtime's bound lets it hold.
_BIG_ROWS, _BIG_WIDTH = 1600, 8192
#: The transaction of the baseline: big enough to warm the runtime's buffers and pools.
_WARM_ROWS = 100


def test_big_transaction(source: SourceUnderTest, runtime: Runtime, cell: Cell) -> None:
    """A transaction of 12.8 MB of 8 KB rows arrives whole; where the runtime is a
    process of its own with a bound (the engine: the source's batch settings, 50
    changes), its peak RSS grows by less than half the transaction over its peak after
    a transaction of 100 such rows (the baseline: buffers and pools warm). Bounded, it
    grows by 0.1-5 MB; holding the transaction, by more than its size (its text, the
    events, the converted records: ``tidemark capture`` grows 17-28 MB).

    Not asserted: ``tidemark capture`` has no option for its batch size (its batches
    hold up to 10,000 changes, the connectors' default: more than this transaction);
    the Spark source and ``tidemark run`` share the JVM's heap, which Spark does not
    let under 450 MiB, proven with a transaction several times that in
    tests/pipeline/test_pipeline_memory_bound.py (minutes: too long for the matrix)."""
    settings = source.batch_settings() if runtime.name.startswith("engine-") else {}
    with opened(runtime, source, cell.where, **settings) as running:
        _open_stream(running, source)
        peak = running.peak_kib if isinstance(running, EngineRunning) else None
        source.execute(*source.big_transaction(100_000, _WARM_ROWS, _BIG_WIDTH))
        _settled(running, source, "a transaction of a few wide rows", cell.patience_s)
        baseline = peak() if peak else 0
        source.execute(*source.big_transaction(1000, _BIG_ROWS, _BIG_WIDTH))
        _settled(running, source, "a transaction of wide rows", cell.patience_s)
        if peak:
            grown = peak() - baseline
            size_kib = _BIG_ROWS * _BIG_WIDTH // 1024
            assert grown < size_kib // 2, (
                f"{runtime.name} on {source.name}: peak RSS grew {grown} KiB for a "
                f"transaction of {size_kib} KiB, bound {settings or 'default'}")


def test_sigkill(source: SourceUnderTest, runtime: Runtime, cell: Cell) -> None:
    """Killed mid-stream and started again: nothing lost; the engine redelivers at most
    its in-flight limit (docs/configuration.md, "What a crash redelivers"), ``tidemark
    run`` killed at its named points (:mod:`tidemark.faults`) holds every row once."""
    if runtime.kill_refusal:
        pytest.skip(runtime.kill_refusal)
    work = source.workload()
    with opened(runtime, source, cell.where) as first:
        _open_stream(first, source)
        for transaction in work[:3]:
            source.execute(*transaction)
        if isinstance(first, PipelineRunning):
            # Batch read, written to Delta, not yet in Spark's commit log: the restart
            # replays it, and Delta must not take it twice. (One point: a driver start
            # costs ~20 s; the other points: tests/pipeline/test_pipeline_run.py.)
            first.crash_at("after_write")
        else:
            first.kill()
    for transaction in work[3:]:
        source.execute(*transaction)
    with opened(runtime, source, cell.where) as again:
        _settled(again, source, "the workload after a SIGKILL and a restart",
                 cell.patience_s)
        if isinstance(again, EngineRunning):
            assert again.redelivered() <= MAX_IN_FLIGHT, again.redelivered()


def test_debezium(source: SourceUnderTest, runtime: Runtime, cell: Cell) -> None:
    """Debezium's own output for the source's reference script (snapshot and stream)
    equals the runtime's, record by record, but for the deliberate differences listed
    in :mod:`debezium_comparison`."""
    case = source.debezium()
    if case is None:
        pytest.skip("no Debezium connector for this source")
    if runtime.name not in ("capture", "engine-json"):
        pytest.skip("not Debezium JSON")
    case.run_statements(case.setup)
    settings = ({"capture_args": case.capture_args} if runtime.name == "capture" else
                case.engine_settings())
    with opened(runtime, source, cell.where, **settings) as running:
        lines: Any = running.json_lines  # type: ignore[attr-defined]
        wait_for(lambda: any('"snapshot":"last"' in line for line in lines()), 120,
                 f"{source.name}: the reference's snapshot")
        case.run_statements(case.stream)
        wait_for(lambda: any(case.end_marker in line for line in lines()), 120,
                 f"{source.name}: the reference script's end")
        got = case.normalize(lines())
    found = case.compare(case.reference, got, runtime.name != "capture")
    assert_same_as_debezium(found, case.allowed, case.run)


def test_refusal(source: SourceUnderTest, runtime: Runtime, cell: Cell) -> None:
    """An option the source does not have is refused at start, naming it: never taken
    and ignored, never found by a user later."""
    if runtime.name == "capture":
        options, says = source.refused_capture
        if not says:
            pytest.skip("PostgreSQL has every option of tidemark capture")
        chosen = ["--source", "logtable"] if "--source" in source.capture_args() else []
        done = subprocess.run([sys.executable, "-m", "tidemark", "capture", "--dsn",
                               source.dsn, *chosen, *options], capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode != 0 and says in done.stderr, done.stderr
        assert not done.stdout, "output before the refusal"
        return
    if runtime.name == "spark":
        import tidemark.spark as ts  # noqa: PLC0415

        option, says = source.refused_spark
        spark = runtime.spark  # type: ignore[attr-defined]
        with pytest.raises(Exception, match=option) as refused:
            ts.read_table(spark, dsn=source.dsn, table=source.table,
                          **{**source.spark_options(), option: "x"})
        assert says in str(refused.value)
        return
    if runtime.name == "run":
        for line, says in (('skipped_operations = "t"', "tidemark run delivers every operation"),
                           source.refused_run):
            where = cell.where / line.split()[0]
            with pytest.raises(Exception) as refused:
                PipelineRunning(source, where, runtime.spark,  # type: ignore[attr-defined]
                                extra_source=line + "\n")
            assert says in str(refused.value), repr(refused.value)
            assert isinstance(refused.value, ConfigError), (
                f"{line!r}: refused late, by {type(refused.value).__name__}: "
                f"{refused.value}")
            assert not (where / "chk").exists(), f"{line!r}: a checkpoint made before the refusal"
        return
    # The engine: its connector refuses a setting it does not have when it is built.
    import tidemark  # noqa: PLC0415

    setting, value = source.refused_engine
    connector, values = source.engine_connector(**{setting: value})
    with pytest.raises(ConfigError, match=f"{setting}: unknown setting"):
        getattr(tidemark, connector)(values)
