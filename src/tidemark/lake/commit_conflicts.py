"""Applying a batch again when another writer's commit races it: an ``OPTIMIZE``, a
manual fix or another tool committing to the target between the batch's read of the
table and its commit."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, TypeVar

from deltalake.exceptions import CommitFailedError

from tidemark.lake.delta_log import CommitConflictError

log = logging.getLogger(__name__)

#: How many times a batch is applied again after such a race.
COMMIT_CONFLICT_RETRIES: Final = 5

_T = TypeVar("_T")


def despite_other_writers(attempt: Callable[[], _T], uri: str, app_id: str,
                          version: int) -> _T:
    """*attempt()* (which reads the target's latest version and commits the batch
    ``(app_id, version)`` to it), again after a refused commit: delta-rs's
    ``CommitFailedError`` (copy-on-write), :class:`CommitConflictError`
    (merge-on-read). Nothing of a refused attempt is committed, and were it, the app
    transaction would make the next attempt skip the batch."""
    for number in range(1, COMMIT_CONFLICT_RETRIES + 2):
        try:
            return attempt()
        except (CommitFailedError, CommitConflictError) as err:
            if number > COMMIT_CONFLICT_RETRIES:
                raise
            log.warning("another writer committed to %s while batch %s of %s was being "
                        "applied (%s): applying it again on the new version (%d/%d)",
                        uri, version, app_id, str(err).splitlines()[0], number,
                        COMMIT_CONFLICT_RETRIES)
    raise AssertionError("unreachable: the loop returns or raises")
