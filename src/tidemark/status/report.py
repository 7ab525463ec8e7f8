"""What every status shares, whatever its source: the status dict's type and the
plain-text rendering helpers (times, sizes, aligned rows, findings, an incremental
snapshot in progress, a pipeline's targets)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

Status = dict[str, Any]
"""A status as ``--json`` prints it (see :mod:`tidemark.status` for the keys)."""


def iso_time(epoch_seconds: float | None) -> str | None:
    """Seconds since the epoch as ISO 8601 UTC (``2026-11-25T08:26:27.108Z``)."""
    if epoch_seconds is None:
        return None
    moment = datetime.datetime.fromtimestamp(epoch_seconds, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
                                "last commit", "path"), body), *merge_lines(targets)]


def merge_lines(targets: Sequence[dict[str, Any]]) -> list[str]:
    """How each target is merged, and the rows its deletion vectors hide (merge-on-read
    targets; a ``merge:`` block, empty when every target is plain copy-on-write)."""
    lines = []
    for t in targets:
        if t.get("merge", "copy_on_write") == "copy_on_write" and \
                not t.get("deletion_vector_files"):
            continue
        text = f"  {t['table']}: {t['merge']}"
        if t.get("deletion_vector_files") is not None:
            fraction = t["deleted_fraction"]
            text += (f", {t['deletion_vector_files']} of {t['files']} files with deletion "
                     f"vectors, {t['deleted_rows']} rows deleted"
                     + (f" ({fraction:.1%} of the rows)" if fraction is not None else ""))
        lines.append(text)
    return ["merge:", *lines] if lines else []
