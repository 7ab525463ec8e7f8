"""``tidemark status`` for a MariaDB source: the server's binlog, and where a capture's
offsets file or a pipeline's checkpoint stands in it.

A MariaDB capture holds nothing on the server (no slot): what can go wrong is that the
binlog it needs was purged (``expire_logs_days``, ``PURGE BINARY LOGS``) before it read
it, which the status reports as a problem, with the way out.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tidemark.errors import ConfigError
from tidemark.offsets.store import decode_json_object
from tidemark.source.mariadb import client
from tidemark.source.mariadb.position import BinlogPosition
from tidemark.source.snapshot_progress import OFFSET_KEY
from tidemark.status.report import (
    Status,
    human_bytes,
    incremental,
    incremental_row,
    render,
)


def server_section(dsn: str) -> tuple[dict[str, Any], list[str]]:
    settings = client.parse_url(dsn)
    with contextlib.closing(client.connect(settings)) as conn:
        end = client.current_position(conn)
        files = client.binlog_files(conn)
        version = client.server_variables(conn, "version").get("version", "")
    section = {"host": f"{settings.host}:{settings.port}", "version": version,
               "binlog_file": end.file, "binlog_pos": end.pos, "gtids": end.gtids,
               "oldest_binlog": files[0] if files else None, "binlogs": len(files)}
    return section, files


def position_findings(position: BinlogPosition | None, server: dict[str, Any],
                       files: list[str], what: str, problems: list[str]) -> dict[str, Any]:
    """The ``lag`` section of *position* against the server's end."""
    lag: dict[str, Any] = {"bytes": None, "files_behind": None, "note": None}
    if position is None:
        lag["note"] = f"no {what} position yet"
        return lag
    if position.file not in files:
        problems.append(
            f"the {what} position {position} is in a binlog the server no longer has (purged; "
            f"oldest kept: {server['oldest_binlog']}): the changes since then are lost to the "
            "stream. Restart with snapshot_mode=when_needed to take a new snapshot.")
        return lag
    behind = files.index(server["binlog_file"]) - files.index(position.file) \
        if server["binlog_file"] in files else None
    lag["files_behind"] = behind
    if behind == 0:
        lag["bytes"] = max(0, server["binlog_pos"] - position.pos)
    return lag


def capture_status(dsn: str, offsets_file: str | None) -> Status:
    """A MariaDB capture's status: the server and its offsets file (if given)."""
    problems: list[str] = []
    warnings: list[str] = []
    server, files = server_section(dsn)
    settings = client.parse_url(dsn)
    offsets: dict[str, Any] | None = None
    position = None
    if offsets_file is not None:
        path = Path(offsets_file)
        offsets = {"file": str(path), "exists": path.exists(), "found": False,
                   "position": None, "gtids": None, "incremental_snapshot": None}
        if path.exists():
            saved = decode_json_object(path.read_bytes(), str(path))
            entries = [v for k, v in saved.items()
                       if k.startswith(f"mariadb/{settings.host}:{settings.port}/")]
            if entries and isinstance(entries[0], dict) and "binlog" in entries[0]:
                try:
                    position = BinlogPosition.from_offset(entries[0]["binlog"])
                except ConfigError as err:
                    problems.append(str(err))
                else:
                    state = entries[0].get(OFFSET_KEY)
                    offsets.update(found=True, position=f"{position.file}:{position.pos}",
                                   gtids=position.gtids, incremental_snapshot=incremental(
                                       state if isinstance(state, dict) else None))
            else:
                warnings.append(f"{path} holds no offset of a capture of this server: the "
                                "next capture starts with a snapshot (snapshot_mode)")
        else:
            warnings.append(f"{path} does not exist yet: the next capture starts with a "
                            "snapshot (snapshot_mode)")
    lag = position_findings(position, server, files, "saved", problems)
    return {"kind": "capture", "source": "mariadb", "healthy": not problems,
            "problems": problems, "warnings": warnings, "server": server,
            "offsets": offsets, "lag": lag}


def server_rows(status: Status) -> list[tuple[str, str]]:
    s, lag = status["server"], status["lag"]
    rows = [("server", f"MariaDB {s['version']} at {s['host']}: binlog at {s['binlog_file']}:"
                       f"{s['binlog_pos']} (GTID {s['gtids'] or '-'}); oldest kept "
                       f"{s['oldest_binlog']} ({s['binlogs']} files)")]
    if lag["bytes"] is not None:
        rows.append(("lag", f"{human_bytes(lag['bytes'])} of binlog behind"))
    elif lag["files_behind"] is not None:
        rows.append(("lag", f"{lag['files_behind']} binlog file(s) behind"))
    elif lag["note"]:
        rows.append(("lag", lag["note"]))
    return rows


def render_capture(status: Status) -> str:
    rows = server_rows(status)
    offsets = status["offsets"]
    if offsets is not None:
        where = offsets["position"] or "no offset of this server"
        rows.append(("offsets", f"{offsets['file']}: {where}"))
        if offsets["incremental_snapshot"]:
            rows.append(incremental_row(offsets["incremental_snapshot"]))
    return render("MariaDB capture", rows, status)


def status_of_capture(dsn: str, *, slot: str, offsets: str | None,
                      topic_prefix: str) -> Status:
    """:func:`capture_status` as ``tidemark status`` asks every kind's."""
    return capture_status(dsn, offsets)
