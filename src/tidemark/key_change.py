"""The primary-key-change rule every source's change rows follow, written once.

An update that changes its row's key becomes two changes: a delete of the old key, then
a create of the new row (Debezium's events), so that consumers keyed by it (a Delta
merge, a compacted Kafka topic) see both keys. PostgreSQL's change builder and Spark walk
and MariaDB's change builder decide it here.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidemark.event import UNAVAILABLE


def key_changed(key: Sequence[int], old: Sequence[object], new: Sequence[object]) -> bool:
    """Whether an update changed its row's key (the values at positions *key*): such
    an update becomes two change rows, ``d`` of the old key then ``c`` of the new row,
    so that keyed consumers see both keys (Debezium's events). A new value the source
    did not send (:data:`~tidemark.event.UNAVAILABLE`: PostgreSQL's unchanged TOAST
    value of a wide key under ``REPLICA IDENTITY FULL``) is unchanged."""
    for i in key:  # noqa: SIM110 - no generator per update row: the binlog's hot path
        if old[i] != new[i] and new[i] is not UNAVAILABLE:
            return True
    return False
