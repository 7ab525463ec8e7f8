"""The conformance matrix's report: at the end of a run, every cell (source, runtime,
check) with its result, its time and, for a skip or an xfail, the reason.

Hooks imported by the suite's ``tests/conftest.py``: a ``conftest.py`` of its own here
would shadow that one for the modules that import helpers from it.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

_CELL = re.compile(r"test_matrix\.py::test_(\w+)\[([\w-]+?)-(capture|engine-\w+|spark|run)\]")
_cells: dict[tuple[str, str, str], list[Any]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    match = _CELL.search(report.nodeid)
    if match is None:
        return
    check, source, runtime = match.groups()
    entry = _cells.setdefault((source, runtime, check), ["", 0.0, ""])
    entry[1] += report.duration
    if report.when == "call" or report.outcome != "passed":
        if hasattr(report, "wasxfail"):
            entry[0] = "xfail" if report.skipped else "XPASS"
            entry[2] = report.wasxfail
        elif report.skipped:
            entry[0] = "skipped"
            longrepr = report.longrepr
            entry[2] = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        elif not entry[0] or report.outcome != "passed":
            entry[0] = report.outcome


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _cells:
        return
    write = terminalreporter.write_line
    terminalreporter.section("conformance matrix")
    for (source, runtime, check), (outcome, seconds, why) in sorted(_cells.items()):
        write(f"{source:18} {runtime:13} {check:16} {outcome:8} {seconds:6.1f}s  {why}")
