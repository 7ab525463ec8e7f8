"""The parts of a status that a capture and a pipeline share: server, slot, lag.

Also the plain-text rendering helpers (sizes, LSNs, aligned rows) used by both.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from tidemark.source.postgres.pgoutput import lsn_to_str
from tidemark.source.postgres.slot_status import (
    ServerWal,
    SlotState,
    lag_bytes,
    retained_bytes,
    time_lag,
)

Status = dict[str, Any]
"""A status as ``--json`` prints it (see :mod:`tidemark.status` for the keys)."""


def lsn(value: int | None) -> str | None:
    """An LSN as PostgreSQL prints it, None for None."""
    return None if value is None else lsn_to_str(value)


def iso_time(epoch_seconds: float | None) -> str | None:
    """Seconds since the epoch as ISO 8601 UTC (``2026-11-25T08:26:27.108Z``)."""
    if epoch_seconds is None:
        return None
    moment = datetime.datetime.fromtimestamp(epoch_seconds, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def server_section(server: ServerWal) -> dict[str, Any]:
    return {"database": server.database, "version_num": server.version_num,
            "in_recovery": server.in_recovery, "end_lsn": lsn(server.end_lsn),
            "current_lsn": lsn(server.current_lsn)}


def slot_section(name: str, slot: SlotState | None, server: ServerWal) -> dict[str, Any]:
    """The ``slot`` keys; all null but ``name`` and ``exists`` for a missing slot."""
    holder = slot.holder if slot is not None else None
    return {
        "name": name,
        "exists": slot is not None,
        "type": slot.slot_type if slot else None,
        "plugin": slot.plugin if slot else None,
        "database": slot.database if slot else None,
        "temporary": slot.temporary if slot else None,
        "active": slot.active if slot else None,
        "active_pid": holder.pid if holder else None,
        "holder_application": holder.application_name if holder else None,
        "holder_backend_type": holder.backend_type if holder else None,
        "holder_client_addr": holder.client_addr if holder else None,
        "restart_lsn": lsn(slot.restart_lsn) if slot else None,
        "confirmed_flush_lsn": lsn(slot.confirmed_flush_lsn) if slot else None,
        "wal_status": slot.wal_status if slot else None,
        "safe_wal_size_bytes": slot.safe_wal_size if slot else None,
        "wal_retained_bytes": retained_bytes(slot, server) if slot else None,
    }


def lag_section(slot: SlotState | None, server: ServerWal, *,
                checkpoint_lsn: int | None = None) -> dict[str, Any]:
    """How far the consumer is behind the server: from the slot's confirmed position, or
    for a pipeline from *checkpoint_lsn*, the end of its last committed batch (the Spark
    source advances the slot there only when the next batch starts)."""
    source: str | None
    position: int | None
    if checkpoint_lsn is not None:
        source, position = "checkpoint", checkpoint_lsn
        behind = (None if server.current_lsn is None
                  else max(0, server.current_lsn - checkpoint_lsn))
    else:
        source = "slot" if slot is not None else None
        position = slot.confirmed_flush_lsn if slot is not None else None
        behind = lag_bytes(slot, server) if slot is not None else None
    measured = time_lag(slot, behind)
    note = measured.note
    if source == "checkpoint" and measured.seconds is None:
        note = ("the pipeline reads its slot through SQL, not a walsender, so the server "
                "measures no lag in time; last_run holds the lag of its last batch")
    return {"from": source, "from_lsn": lsn(position), "bytes": behind,
            "seconds": measured.seconds, "seconds_source": measured.source, "note": note}


def slot_findings(name: str, slot: SlotState | None, server: ServerWal,
                  problems: list[str], warnings: list[str]) -> None:
    """Append what is wrong with the slot (for tidemark's use) to *problems*/*warnings*."""
    if slot is None:
        problems.append(f"replication slot {name!r} does not exist on this server")
        return
    if slot.slot_type != "logical" or slot.plugin != "pgoutput":
        kind = (f"a {slot.slot_type} slot" if slot.slot_type != "logical"
                else f"a logical slot of plugin {slot.plugin!r}")
        problems.append(f"replication slot {name!r} is {kind}; tidemark reads only "
                        "pgoutput logical slots")
    if slot.database is not None and slot.database != server.database:
        problems.append(f"replication slot {name!r} belongs to database "
                        f"{slot.database!r}, not {server.database!r} (the one connected "
                        "to)")
    if slot.wal_status == "lost":
        problems.append(f"replication slot {name!r} is invalidated (wal_status lost): "
                        "the server removed WAL it had not confirmed, so its unread "
                        "changes are gone and it cannot be read any more")
    elif slot.wal_status == "unreserved":
        problems.append(f"replication slot {name!r} holds more WAL than the server keeps "
                        "(wal_status unreserved): it will be invalidated at the next "
                        "checkpoint unless its consumer catches up now")
    if slot.temporary:
        warnings.append(f"replication slot {name!r} is temporary: it disappears with the "
                        "session that created it")


def human_bytes(count: int | None) -> str:
    """``103 B``, ``12.0 KiB``, ``1.2 GiB``; ``?`` for unknown."""
    if count is None:
        return "?"
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} B"  # pragma: no cover - the loop always returns


def slot_lines(status: Status) -> list[tuple[str, str]]:
    """The slot, lag and WAL rows of the human output."""
    slot = status["slot"]
    server = status["server"]
    lag = status["lag"]
    if not slot["exists"]:
        return [("slot", f"{slot['name']}: does not exist (database {server['database']})")]
    if slot["active"]:
        holder = ", ".join(str(part) for part in (
            slot["holder_backend_type"],
            f"application {slot['holder_application']!r}" if slot["holder_application"]
            else None,
            slot["holder_client_addr"]) if part)
        state = f"active, pid {slot['active_pid']}" + (f" ({holder})" if holder else "")
    else:
        state = "inactive"
    rows = [("slot", f"{slot['name']}: {state}, {slot['type']} {slot['plugin']}, "
                     f"database {slot['database']}")]
    rows.append(("position", f"confirmed {slot['confirmed_flush_lsn']}, server "
                             f"{server['current_lsn']}"))
    if lag["from"] == "checkpoint":
        rows.append(("applied", f"{lag['from_lsn']} (the checkpoint's last committed "
                                "batch; the slot follows when the next batch starts)"))
    if lag["seconds"] is not None:
        seconds = f"{lag['seconds']:.1f} s ({lag['note']})"
    else:
        seconds = f"unknown seconds ({lag['note']})"
    rows.append(("lag", f"{human_bytes(lag['bytes'])} behind the server; {seconds}"))
    safe = slot["safe_wal_size_bytes"]
    keep = ("" if slot["wal_status"] is None else
            f" (wal_status {slot['wal_status']}, safe_wal_size "
            f"{'unlimited' if safe is None else human_bytes(safe)})")
    rows.append(("WAL retained", f"{human_bytes(slot['wal_retained_bytes'])}{keep}"))
    return rows


def render(title: str, rows: Sequence[tuple[str, str]], status: Status,
           tail: Sequence[str] = ()) -> str:
    """The human output: a title with OK/PROBLEM, aligned rows, extra lines, findings."""
    verdict = "OK" if status["healthy"] else "PROBLEM"
    width = max((len(label) for label, _ in rows), default=0)
    lines = [f"{title}: {verdict}"]
    lines += [f"  {label.ljust(width)}  {value}" for label, value in rows]
    lines += list(tail)
    for heading, items in (("problems", status["problems"]), ("warnings", status["warnings"])):
        if items:
            lines.append(f"{heading}:")
            lines += [f"  - {item}" for item in items]
    return "\n".join(lines)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Plain aligned columns (no dependency on a rendering library)."""
    widths = [max(len(str(cell)) for cell in column)
              for column in zip(header, *rows, strict=True)]
    return ["  " + "  ".join(str(cell).ljust(width)
                             for cell, width in zip(line, widths, strict=True)).rstrip()
            for line in (header, *rows)]


def incremental(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """An incremental snapshot in progress, as the saved offset has it: the tables left,
    and how far the current one is (its last key sent of its maximum key)."""
    if not state or not state.get("tables"):
        return None
    tables = [t for t in state["tables"] if isinstance(t, dict)]
    current = tables[0] if tables else {}
    return {"tables": [t.get("table") for t in tables], "paused": bool(state.get("paused")),
            "current": current.get("table"), "last_key": current.get("last_key"),
            "max_key": current.get("max_key")}


def incremental_row(running: dict[str, Any]) -> tuple[str, str]:
    """The status line of an incremental snapshot in progress."""
    return ("incremental snapshot",
            f"{', '.join(running['tables'])}: {running['current']} at key "
            f"{running['last_key'] or '(start)'} of {running['max_key'] or '?'}"
            f"{' (paused)' if running['paused'] else ''}")


def target_lines(targets: Sequence[dict[str, Any]]) -> list[str]:
    """A pipeline's targets as an aligned table, under a ``targets:`` line."""
    body = [tuple("-" if v is None else str(v) for v in (
        t["table"], "LOST" if t["lost"] else t["delta_version"], t["rows"],
        t["last_batch_id"], t["last_commit_at"], t["path"])) for t in targets]
    return ["targets:", *table(("table", "delta version", "rows", "last batch",
                                "last commit", "path"), body)]
