"""The status of a ``tidemark capture``: its slot on the server and its offsets file.

The offsets file is read, never written (and never locked): a capture may be saving it
at the same moment, which its atomic replace makes safe to read.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tidemark.errors import ConfigError
from tidemark.offsets.store import decode_json_object
from tidemark.source.postgres import session
from tidemark.source.postgres.pgoutput import lsn_to_str
from tidemark.source.postgres.slot_status import ServerWal, SlotState, read_server, read_slot
from tidemark.status.report import (
    Status,
    human_bytes,
    incremental,
    incremental_row,
    lag_section,
    render,
    server_section,
    slot_findings,
    slot_lines,
    slot_section,
)

_MAX_LSN = (1 << 64) - 1


def capture_status(dsn: str, slot_name: str, offsets_file: str | None) -> Status:
    """Ask the server about *slot_name* and compare the offsets file with it."""
    with contextlib.closing(session.connect(dsn, application_name="tidemark status")) as conn:
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
