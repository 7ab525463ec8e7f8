"""The PostgreSQL connector's offset and its shape.

The connector saves ``{"lsn": <int>, "snapshot_completed": <bool>}``: the position up to
which everything has been handed on, and whether the initial snapshot is behind it. An
offset read back is checked before anything touches the publication or the slot: a
malformed one would otherwise fail halfway through the start, with a traceback.
"""

from __future__ import annotations

from typing import Any

from tidemark.errors import ConfigError
from tidemark.offsets.store import show_json

MAX_LSN = (1 << 64) - 1

SHAPE = '{"lsn": <integer from 0 to 2^64-1>, "snapshot_completed": true|false}'


def check_shape(offset: Any, where: str) -> None:
    """Fail (:class:`ConfigError`, key ``offsets``) unless *offset* is an offset this
    connector saves; *where* names it (``key 'postgres/db/slot' in offsets file …``)."""

    def wrong(problem: str) -> ConfigError:
        return ConfigError("offsets", f"{where}: {problem}; a PostgreSQL offset is {SHAPE}")

    if not isinstance(offset, dict):
        raise wrong(f"holds {show_json(offset)}, not a JSON object")
    if "lsn" not in offset:
        raise wrong(f"{show_json(offset)} has no lsn")
    lsn = offset["lsn"]
    # bool is an int to Python, but true is no position.
    if isinstance(lsn, bool) or not isinstance(lsn, int) or not 0 <= lsn <= MAX_LSN:
        raise wrong(f"lsn is {show_json(lsn)}")
    completed = offset.get("snapshot_completed", False)
    if not isinstance(completed, bool):
        raise wrong(f"snapshot_completed is {show_json(completed)}")

