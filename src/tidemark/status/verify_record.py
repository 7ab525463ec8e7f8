"""The last ``tidemark verify`` of a pipeline, kept in ``<checkpoint>/verify.json``
(written atomically after each verify) for ``tidemark status`` and the metrics."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Final

from tidemark.atomic_file import write_atomically
from tidemark.status.report import iso_time

FILE_NAME: Final = "verify.json"


def record_path(checkpoint: str | os.PathLike[str]) -> Path:
    """Where a pipeline's verify record is."""
    return Path(checkpoint) / FILE_NAME


def write_record(checkpoint: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Replace the verify record of *checkpoint* (a verify result's JSON; made if the
    checkpoint directory does not exist yet)."""
    Path(checkpoint).mkdir(parents=True, exist_ok=True)
    write_atomically(record_path(checkpoint),
                     json.dumps(record, sort_keys=True).encode("utf-8"))


def read_record(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The last verify's record (None: never verified, or an unreadable file)."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        record = json.loads(record_path(checkpoint).read_text(encoding="utf-8"))
        if isinstance(record, dict):
            return record
    return None


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """The status's ``verify`` section: when, the result, rows compared and differing
    per table."""
    return {"started_at": record.get("started_at"), "result": record.get("result"),
            "error": record.get("error"),
            "tables": {str(t.get("table")): {"rows_compared": t.get("rows_compared"),
                                             "rows_different": t.get("rows_different")}
                       for t in record.get("tables") or () if isinstance(t, dict)}}


def verify_section(checkpoint: str) -> dict[str, Any] | None:
    """The status's ``last_verify`` section (None: never verified)."""
    record = read_record(checkpoint)
    return None if record is None else summary(record)


def verify_rows(status: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``last verify`` row of a pipeline's human status (none if never verified)."""
    section = status.get("last_verify")
    return [("last verify", render(section)[0].removeprefix("last verify: "))] \
        if section else []


def render(section: dict[str, Any]) -> list[str]:
    """The status's lines of a ``verify`` section."""
    when = section.get("started_at")
    at = (iso_time(float(when)) if isinstance(when, (int, float)) else None) or "?"
    tables = section.get("tables") or {}
    parts = [f"{name}: {t.get('rows_different')} of {t.get('rows_compared')} rows differ"
             for name, t in tables.items()]
    error = f" ({section['error']})" if section.get("error") else ""
    return [f"last verify: {section.get('result')}{error} at {at}"
            + (f"; {'; '.join(parts)}" if parts else "")]
