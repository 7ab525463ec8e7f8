"""``tidemark status`` for a PostgreSQL source: the server's WAL, the replication slot
and the lag (shared with a pipeline's status, :mod:`tidemark.status.postgres_pipeline`),
and a ``tidemark capture``'s status: its slot on the server and its offsets file.

The offsets file is read, never written (and never locked): a capture may be saving it
at the same moment, which its atomic replace makes safe to read.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tidemark import postgres_connection as pgconn
from tidemark.errors import ConfigError
from tidemark.offsets.store import decode_json_object
from tidemark.source.postgres.pgoutput import lsn_to_str
from tidemark.source.postgres.slot_status import (
    ServerWal,
    SlotState,
    lag_bytes,
    read_server,
    read_slot,
    retained_bytes,
    time_lag,
)
from tidemark.status.report import (
    Status,
    human_bytes,
    incremental,
    incremental_row,
    render,
)

_MAX_LSN = (1 << 64) - 1


def lsn(value: int | None) -> str | None:
    """An LSN as PostgreSQL prints it, None for None."""
    return None if value is None else lsn_to_str(value)


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


# -- a capture's status ------------------------------------------------------------------


def capture_status(dsn: str, slot_name: str, offsets_file: str | None) -> Status:
    """Ask the server about *slot_name* and compare the offsets file with it."""
    with contextlib.closing(pgconn.connect(dsn, application_name="tidemark status")) as conn:
        server = read_server(conn)
        slot = read_slot(conn, slot_name, server)
    problems: list[str] = []
    warnings: list[str] = []
    slot_findings(slot_name, slot, server, problems, warnings)
    key = f"postgres/{server.database}/{slot_name}"
    offsets = None
    if offsets_file is not None:
        offsets = offsets_section(offsets_file, key, slot, server, problems, warnings)
    return {
        "kind": "capture",
        "healthy": not problems,
        "problems": problems,
        "warnings": warnings,
        "server": server_section(server),
        "slot": slot_section(slot_name, slot, server),
        "lag": lag_section(slot, server),
        "offsets": offsets,
        "snapshot": _snapshot(offsets),
    }


def offsets_section(file: str, key: str, slot: SlotState | None, server: ServerWal,
                    problems: list[str], warnings: list[str]) -> dict[str, Any]:
    """The saved offset of *key* and what it means next to the slot and the server."""
    path = Path(file)
    section: dict[str, Any] = {
        "file": str(path.resolve()), "key": key, "exists": path.is_file(), "found": False,
        "lsn": None, "snapshot_completed": None, "incremental_snapshot": None,
        "keys": [], "state": None,
        "bytes_vs_slot": None, "meaning": None}

    def done(state: str, meaning: str) -> dict[str, Any]:
        section["state"] = state
        section["meaning"] = meaning
        return section

    if not section["exists"]:
        if path.exists():
            problems.append(f"offsets file {file} is not a file")
            return done("invalid", "not a file")
        return done("no_file", "no offset saved yet: a capture with this file starts at "
                               "the slot (with the initial snapshot first, as "
                               "--snapshot-mode says)")
    try:
        offsets = decode_json_object(path.read_bytes(), f"offsets file {file}")
    except (OSError, ConfigError) as err:
        text = err.strerror if isinstance(err, OSError) else str(err).removeprefix("offsets: ")
        problems.append(f"cannot read offsets file {file}: {text}")
        return done("invalid", "unreadable: a capture with this file would refuse to start")
    section["keys"] = sorted(offsets)
    offset = offsets.get(key)
    if offset is None:
        others = f" (it has {', '.join(section['keys'])})" if offsets else ""
        warnings.append(f"offsets file {file} has no offset under {key!r}{others}: "
                        "is it the file of another slot or database?")
        return done("no_key", f"no offset saved under {key!r}: a capture with this file "
                              "starts at the slot, as without one")
    value = offset.get("lsn") if isinstance(offset, dict) else None
    completed = offset.get("snapshot_completed", False) if isinstance(offset, dict) else None
    if (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_LSN
            or not isinstance(completed, bool)):
        problems.append(f"offsets file {file}: {key!r} holds {offset!r}, not a PostgreSQL "
                        'offset {"lsn": <integer>, "snapshot_completed": true|false}')
        return done("invalid", "not a PostgreSQL offset: a capture would refuse to start")
    incremental = offset.get("incremental_snapshot")
    section.update(found=True, lsn=lsn_to_str(value), snapshot_completed=completed,
                   incremental_snapshot=incremental if isinstance(incremental, dict) else None)
    return done(*_compare(value, completed, slot, server, section, problems))


def _compare(offset: int, completed: bool, slot: SlotState | None, server: ServerWal,
             section: dict[str, Any], problems: list[str]) -> tuple[str, str]:
    if server.end_lsn is not None and offset > server.end_lsn:
        problems.append(
            f"the saved offset {lsn_to_str(offset)} is ahead of this server's WAL "
            f"({lsn_to_str(server.end_lsn)}): it comes from another server or was edited; "
            "a capture refuses to start from it (delete the key to start from the slot)")
        return "ahead_of_server", "broken: the offset cannot belong to this server"
    if slot is None or slot.confirmed_flush_lsn is None:
        if completed:
            problems.append(
                f"the offsets say capture reached {lsn_to_str(offset)} but the slot is gone: "
                "changes since then are lost; a capture refuses to start unless "
                "--snapshot-mode when_needed (a new snapshot)")
        return "no_slot", "no slot to compare with"
    diff = offset - slot.confirmed_flush_lsn
    section["bytes_vs_slot"] = diff
    if diff == 0:
        return "in_step", "the slot is confirmed exactly up to the saved offset"
    if diff < 0:
        if not completed:
            return "behind_slot", (
                f"{human_bytes(-diff)} behind the slot: a snapshot is under way, and a "
                "restart takes it again from the slot")
        # Offsets are saved before the slot is confirmed to them: a slot past them was
        # not confirmed by the capture that saved them.
        problems.append(
            f"replication slot {slot.name!r} is at {lsn_to_str(slot.confirmed_flush_lsn)}, "
            f"past the saved offset {lsn_to_str(offset)}: capture never confirmed it there, "
            "so it is not the slot the offsets were taken from (it was dropped and made "
            "again) and the changes in between were never streamed; a capture refuses to "
            "start unless on_slot_lost = \"resnapshot\" or snapshot_mode = \"when_needed\" "
            "(both re-read the tables)")
        return "behind_slot", (
            f"{human_bytes(-diff)} behind the slot: broken, the slot was made again after "
            "these offsets were saved")
    return "ahead_of_slot", (
        f"{human_bytes(diff)} ahead of the slot: fine, the offset is saved before the slot "
        "is confirmed; a restart resumes at the offset")


def _snapshot(offsets: dict[str, Any] | None) -> dict[str, Any]:
    completed = offsets["snapshot_completed"] if offsets else None
    if completed is None:
        note = ("unknown: no saved offset" if offsets is not None
                else "unknown: pass --offsets to read it from the capture's offsets")
    elif completed:
        note = "the initial snapshot is complete"
    else:
        note = ("the initial snapshot is not complete: a capture in snapshot mode initial or "
                "when_needed takes it again before streaming")
    return {"completed": completed, "source": "offsets" if completed is not None else None,
            "incremental": incremental(offsets.get("incremental_snapshot") if offsets
                                       else None), "note": note}


def render_capture(status: Status) -> str:
    """The human output of a capture's status."""
    rows = slot_lines(status)
    offsets = status["offsets"]
    if offsets is not None:
        where = f"{offsets['file']} [{offsets['key']}]"
        value = f"{offsets['lsn']}: " if offsets["found"] else ""
        rows.append(("offsets", f"{where} {value}{offsets['meaning']}"))
    rows.append(("snapshot", status["snapshot"]["note"]))
    running = status["snapshot"]["incremental"]
    if running:
        rows.append(incremental_row(running))
    title = f"capture slot {status['slot']['name']} (database {status['server']['database']})"
    return render(title, rows, status)


def status_of_capture(dsn: str, *, slot: str, offsets: str | None,
                      topic_prefix: str) -> Status:
    """:func:`capture_status` as ``tidemark status`` asks every kind's."""
    return capture_status(dsn, slot, offsets)
