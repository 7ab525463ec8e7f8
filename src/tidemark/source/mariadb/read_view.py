"""A MariaDB read view that holds everything up to a binlog position (snapshots and
repairs of the Spark stream)."""

from __future__ import annotations

import time
from typing import Any, Final

from tidemark.errors import SourceUnavailableError
from tidemark.source.mariadb import snapshot as snap
from tidemark.source.mariadb.position import BinlogPosition

#: Read views opened while the server's is behind the snapshot's position (a few ms at
#: most under load) before the task fails and Spark runs it again.
_READ_VIEW_ATTEMPTS: Final = 50


def read_view_from(conn: Any, at: BinlogPosition) -> BinlogPosition:
    """Open a read view on *conn* that holds everything up to *at*, the position the
    snapshot was planned at, and return its own position.

    InnoDB commits after the binlog write: for a moment a transaction already in the
    binlog before *at* may not be visible. A view that misses it would leave it out of
    the rows, while the stream, starting at *at*, leaves it out too.
    """
    for attempt in range(_READ_VIEW_ATTEMPTS):
        position = snap.begin_snapshot(conn)
        if position.key >= at.key:
            return position
        conn.rollback()
        time.sleep(0.002 * (attempt + 1))
    raise SourceUnavailableError(
        f"the server's read views stayed behind the snapshot's position {at} for "
        f"{_READ_VIEW_ATTEMPTS} attempts")
