"""The matrix's ``debezium`` check: a source's Debezium 3.6.3 reference (its script, run
before and after the runtime starts) captured by a runtime that writes Debezium JSON
(``tidemark capture``, the engine's JSON converter), normalized and compared record by
record with Debezium's own output (:mod:`debezium_comparison`, shared with the sources'
own conformance tests, which compare the serializers without a process in between).

A source with a Debezium connector gives a :class:`DebeziumCase` (``SourceUnderTest.
debezium``); the others have none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from debezium_comparison import (
    MARIADB_ALLOWED,
    POSTGRES_ALLOWED,
    Allowed,
    differences_in_order,
    differences_paired,
)
from tidemark.testing import debezium_reference as pg
from tidemark.testing import debezium_reference_mariadb as maria
from tidemark.testing.debezium_reference import Difference

REFERENCE = Path(__file__).parents[1] / "reference"


@dataclass(frozen=True)
class DebeziumCase:
    """One reference run of one source, and how each runtime is set to match it."""

    run: str
    setup: Sequence[str]
    """Statements before the runtime starts: their rows are the snapshot."""
    stream: Sequence[str]
    """Statements once the snapshot is delivered."""
    reference: list[str]
    end_marker: str
    """Text in the line of the script's last change: everything has arrived."""
    run_statements: Callable[[Sequence[str]], None]
    normalize: Callable[[list[str]], list[str]]
    compare: Callable[[list[str], list[str], bool], list[tuple[int, Difference]]]
    """The differences (reference, tidemark's, whether topics are compared)."""
    allowed: tuple[Allowed, ...]
    settings: dict[str, Any]
    """The reference run's choices as connector settings."""
    capture_args: list[str] = field(default_factory=list)
    engine_extra: dict[str, Any] = field(default_factory=dict)
    """The engine connector's settings besides the run's choices."""

    def engine_settings(self) -> dict[str, Any]:
        """The engine connector's settings and its JSON converter's options."""
        options = {"topic_prefix": self.settings["topic_prefix"],
                   "decimal_handling_mode": self.settings["decimal_handling_mode"],
                   "time_precision_mode": self.settings["time_precision_mode"],
                   "transaction_metadata": self.settings["provide_transaction_metadata"]}
        return {**self.settings, **self.engine_extra, "json_options": options}

    def capture(self, *extra: str) -> list[str]:
        """``tidemark capture``'s options for the run."""
        s = self.settings
        return [*extra, "--snapshot-mode", s["snapshot_mode"], "--topic-prefix",
                s["topic_prefix"], "--decimal-handling-mode", s["decimal_handling_mode"],
                "--time-precision-mode", s["time_precision_mode"],
                *(["--transaction-metadata"] if s["provide_transaction_metadata"] else [])]


def postgres_case(dsn: str, slot: str) -> DebeziumCase:
    """Debezium's PostgreSQL connector, its default run (``debezium-3.6.3/default``)."""
    run = pg.RUNS[0]
    script = pg.load_script(REFERENCE / "debezium_script.sql")
    tables = [arg for table in pg.TABLES for arg in ("--table", table)]
    case = DebeziumCase(
        run.name, script.setup, script.stream,
        (REFERENCE / "debezium-3.6.3" / f"{run.name}.jsonl").read_text().splitlines(),
        pg.END_PREFIX, lambda statements: pg.run_statements(dsn, statements),
        pg.normalize_lines,
        lambda reference, got, topics: differences_in_order(reference, got, topics=topics),
        POSTGRES_ALLOWED, run.tidemark_settings())
    return DebeziumCase(**{**case.__dict__, "capture_args": case.capture(
        *tables, "--slot", slot, "--heartbeat-interval-ms", "0"), "engine_extra": {
            "table_include_list": list(pg.TABLES), "heartbeat_interval_ms": 0}})


def mariadb_case(server: Any, database: str) -> DebeziumCase:
    """Debezium's MySQL connector on MariaDB (tests/reference/mariadb/README.md)."""
    run = maria.RUNS[0]
    workload = maria.load_workload(REFERENCE / "mariadb" / "workload.sql")
    case = DebeziumCase(
        run.name, workload.setup, workload.stream,
        (REFERENCE / "mariadb" / run.file_name()).read_text(encoding="utf-8").splitlines(),
        '"table":"reference_end"',
        lambda statements: maria.run_statements(lambda: server.connect(database), statements),
        lambda lines: maria.normalize_lines(lines, database),
        lambda reference, got, _topics: differences_paired(reference, got),
        MARIADB_ALLOWED, run.tidemark_settings())
    return DebeziumCase(**{**case.__dict__, "capture_args": case.capture(
        "--heartbeat-interval-ms", "0"), "engine_extra": {"heartbeat_interval_ms": 0}})
