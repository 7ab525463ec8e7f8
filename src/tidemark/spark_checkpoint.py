"""What a Spark streaming checkpoint directory says of where its query got to.

Spark writes ``metadata`` (the query id, stable across restarts), ``offsets/<batch>``
(a batch's planned end, before it runs: "v1", the batch metadata, then one offset per
source) and ``commits/<batch>`` (a batch that finished). Read here as plain files, so
that ``tidemark status`` and the checks before a pipeline starts need no Spark.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any


def last_batch(log: Path) -> int | None:
    """The highest batch id in Spark's ``offsets`` or ``commits`` log (None if empty)."""
    if not log.is_dir():
        return None
    return max((int(name) for name in os.listdir(log) if name.isdigit()), default=None)


def committed_source_offset(checkpoint: str) -> tuple[str | None, int | None,
                                                     dict[str, Any] | None]:
    """A checkpoint's query id, last committed batch and that batch's source offset (the
    offsets log's last line, as the source wrote it); Nones for what is not there yet."""
    root = Path(checkpoint)
    query_id: str | None = None
    committed: int | None = None
    offset: dict[str, Any] | None = None
    with contextlib.suppress(FileNotFoundError):
        metadata = (root / "metadata").read_text(encoding="utf-8")
        query_id = str(json.loads(metadata.splitlines()[0])["id"])
        committed = last_batch(root / "commits")
        if committed is not None:
            line = (root / "offsets" / str(committed)).read_text(encoding="utf-8")
            offset = json.loads(line.splitlines()[-1])
    return query_id, committed, offset
