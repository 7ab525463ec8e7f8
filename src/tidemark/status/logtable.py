"""``tidemark status`` for a log-table source: the log, and how far behind the readers are.

A log-table capture holds nothing on the server but its log rows: what can go wrong is
that a log table or its trigger is missing or out of step with its table (changes are
then not logged), which the status reports as a problem, with the way out. Lag is the
number of logged changes each group's reader has not read yet.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tidemark.errors import TidemarkError
from tidemark.offsets.store import decode_json_object
from tidemark.source.logtable.database import LogDatabase, LogTable, Position
from tidemark.source.logtable.reader import open_database
from tidemark.status.report import Status, render


def log_section(db: LogDatabase, include: list[str], problems: list[str]
         ) -> tuple[dict[str, Any], list[LogTable]]:
    section: dict[str, Any] = {"connector": db.connector, "database": db.database,
                               "generations": [], "groups": None, "tables": []}
    try:
        generations = db.generations()
        section["generations"] = [{"number": g.number, "streams": g.streams,
                                   "groups": g.groups, "started_at": g.started_at}
                                  for g in generations]
        section["groups"] = generations[-1].groups
        tables = db.tables(include)
    except TidemarkError as err:
        problems.append(str(err))
        return section, []
    section["tables"] = [str(t.table) for t in tables]
    return section, tables


def behind(db: LogDatabase, tables: list[LogTable], groups: int | None,
            positions: dict[int, Position], what: str, warnings: list[str]
            ) -> dict[str, Any]:
    lag: dict[str, Any] = {"changes": None, "groups_read": len(positions),
                           "groups_unread": None, "note": None}
    if groups is None or not tables:
        return lag
    unread = [g for g in range(groups) if g not in positions]
    lag["groups_unread"] = len(unread)
    if unread and positions:
        warnings.append(f"{len(unread)} of {groups} groups have no {what} position: a "
                        "capture of them starts at the log's beginning")
    start = db.start_position()
    lag["changes"] = sum(db.behind(g, positions.get(g, start), tables) for g in range(groups))
    if not positions:
        lag["note"] = f"no {what} position yet: every logged change is unread"
    return lag


def capture_status(dsn: str, offsets_file: str | None, topic_prefix: str = "tidemark"
                   ) -> Status:
    """A log-table capture's status: the log and its offsets file (if given)."""
    problems: list[str] = []
    warnings: list[str] = []
    offsets: dict[str, Any] | None = None
    positions: dict[int, Position] = {}
    if offsets_file is not None:
        path = Path(offsets_file)
        offsets = {"file": str(path), "exists": path.exists(), "groups": 0}
        if path.exists():
            saved = decode_json_object(path.read_bytes(), str(path))
            prefix = f"{topic_prefix}/logtable/group-"
            for key, value in saved.items():
                if key.startswith(prefix) and key[len(prefix):].isdigit() and \
                        isinstance(value, dict):
                    positions[int(key[len(prefix):])] = value
            offsets["groups"] = len(positions)
            if not positions:
                warnings.append(f"{path} holds no group offset of {topic_prefix!r}: the next "
                                "capture reads the log from its beginning")
    with contextlib.closing(open_database(dsn)) as db:
        log, tables = log_section(db, [], problems)
        lag = behind(db, tables, log["groups"], positions, "saved", warnings) \
            if offsets_file is not None else {"changes": None, "groups_read": None,
                                              "groups_unread": None,
                                              "note": "no --offsets given"}
    return {"kind": "capture", "source": "logtable", "healthy": not problems,
            "problems": problems, "warnings": warnings, "log": log, "offsets": offsets,
            "lag": lag}


def log_rows(status: Status) -> list[tuple[str, str]]:
    log, lag = status["log"], status["lag"]
    generation = log["generations"][-1] if log["generations"] else None
    rows = [("log", f"{log['connector']} database {log['database']}: " + (
        f"generation {generation['number']}, {generation['streams']} streams in "
        f"{generation['groups']} groups; tables {', '.join(log['tables']) or '-'}"
        if generation else "no log tables installed"))]
    if lag["changes"] is not None:
        rows.append(("lag", f"{lag['changes']:,} logged changes not read yet"))
    elif lag["note"]:
        rows.append(("lag", lag["note"]))
    return rows


def render_capture(status: Status) -> str:
    rows = log_rows(status)
    offsets = status["offsets"]
    if offsets is not None:
        rows.append(("offsets", f"{offsets['file']}: {offsets['groups']} group offsets"))
    return render("log-table capture", rows, status)


def status_of_capture(dsn: str, *, slot: str, offsets: str | None,
                      topic_prefix: str) -> Status:
    """:func:`capture_status` as ``tidemark status`` asks every kind's."""
    return capture_status(dsn, offsets, topic_prefix)
