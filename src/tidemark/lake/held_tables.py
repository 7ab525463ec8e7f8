"""Delta tables this process keeps open between batches: :data:`HELD`.

Opening a Delta table replays its log from the last checkpoint: the checkpoint and up
to ``checkpoint_every`` JSON commits. A merge-on-read batch re-adds every file it gives
a new deletion vector, so with spread changes each commit lists most of the table's
files, and each open of a 140-file table re-read megabytes of JSON (18 ms of a 65 ms
batch at 133 files, measured; twice a batch with upkeep). A held table is brought to
the latest version by the commits after its own instead (``update_incremental``).

A table is held by one user at a time: :meth:`HeldTables.take` hands it out and forgets
it, :meth:`HeldTables.give_back` takes it back after a batch that succeeded (a failed
batch's table is dropped, and the next one opens the table afresh). A held table is
trusted only while the commit of its version is the very file it was given back with
(same device, inode, size and modification time): a table deleted and made again at
the same path, or a log rewritten under it, is opened afresh. Only local tables are
held.
"""

from __future__ import annotations

import collections
import logging
import threading

from deltalake import DeltaTable

from tidemark.lake.branch import local_directory
from tidemark.lake.delta_log import CommitFile, commit_file

log = logging.getLogger(__name__)

#: Tables held at most (the least recently given back go first): a pipeline writes a
#: few dozen targets; a process that wrote many tables keeps only the recent ones.
_HELD_MAX = 64

_Key = tuple[str, tuple[tuple[str, str], ...]]


def _anchor(uri: str, version: int) -> CommitFile | None:
    root = local_directory(uri)
    return commit_file(root, version) if root is not None and version >= 0 else None


class HeldTables:
    """Open Delta tables kept between batches (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: collections.OrderedDict[_Key, tuple[DeltaTable, CommitFile]] = \
            collections.OrderedDict()

    @staticmethod
    def _key(uri: str, storage_options: dict[str, str] | None) -> _Key:
        return uri, tuple(sorted((storage_options or {}).items()))

    def take(self, uri: str, storage_options: dict[str, str] | None) -> DeltaTable | None:
        """The table held for *uri*, brought to its latest version, and no longer held;
        None when none is held or the held one cannot be trusted (open it afresh)."""
        with self._lock:
            held = self._held.pop(self._key(uri, storage_options), None)
        if held is None:
            return None
        table, anchor = held
        if _anchor(uri, anchor.version) != anchor:
            log.debug("%s: the held table's version %d is not the commit it was: opened "
                      "afresh", uri, anchor.version)
            return None
        try:
            table.update_incremental()
        except Exception as err:  # whatever the cause, a fresh open decides
            log.debug("%s: the held table could not be brought up to date (%s): opened "
                      "afresh", uri, err)
            return None
        return table

    def give_back(self, uri: str, storage_options: dict[str, str] | None,
                  table: DeltaTable) -> None:
        """Hold *table* (the one at *uri*, after a batch that succeeded) for the next."""
        anchor = _anchor(uri, table.version())
        if anchor is None:
            return
        key = self._key(uri, storage_options)
        with self._lock:
            self._held[key] = (table, anchor)
            self._held.move_to_end(key)
            while len(self._held) > _HELD_MAX:
                self._held.popitem(last=False)


HELD = HeldTables()
