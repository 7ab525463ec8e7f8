"""The Delta tables a pipeline's checkpoint has written to, kept beside Spark's files.

Spark's checkpoint says which changes have been applied, not where they went. If a
target is deleted (or replaced by another table) while its checkpoint remains, the next
batch would create a new table holding only the changes after that point, and nothing
would say that the rest is missing. Recording each target's Delta table id when a batch
first writes to it lets the pipeline stop with an error instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Protocol

import msgspec
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from tidemark.atomic_file import write_atomically
from tidemark.errors import TerminalError

log = logging.getLogger(__name__)

#: The record's file in the checkpoint directory (Spark ignores files it does not know).
FILE_NAME: Final = "tidemark-targets.json"


class Target(Protocol):
    """What the record needs of a pipeline's target (``tidemark run``'s
    :class:`~tidemark.pipeline.config.Target`, ``tidemark status``'s plain copy)."""

    @property
    def table(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def storage_options(self) -> dict[str, str] | None: ...
    @property
    def local(self) -> bool: ...


class TargetLostError(TerminalError):
    """A target this checkpoint has written to is gone or was replaced."""


class _Entry(msgspec.Struct, frozen=True):
    table: str
    delta_table_id: str


def exists(target: Target) -> bool:
    """Whether *target* holds a Delta table (a local directory or an object store)."""
    if target.local:
        return os.path.isdir(os.path.join(target.path, "_delta_log"))
    return DeltaTable.is_deltatable(target.path, storage_options=target.storage_options)


def _delta_table_id(target: Target) -> str | None:
    if not exists(target):
        return None
    try:
        return str(DeltaTable(target.path, storage_options=target.storage_options)
                   .metadata().id)
    except DeltaError:
        return None


class WrittenTargets:
    """The targets recorded in *checkpoint* (see the module docstring)."""

    def __init__(self, checkpoint: str) -> None:
        self._file = Path(checkpoint) / FILE_NAME
        self._checkpoint = checkpoint
        self._entries: dict[str, _Entry] = {}
        if self._file.exists():
            try:
                self._entries = msgspec.json.decode(self._file.read_bytes(),
                                                    type=dict[str, _Entry])
            except msgspec.DecodeError as err:  # not JSON, or not of this shape
                raise TargetLostError(f"{self._file} is not tidemark's record of the "
                                      f"checkpoint's targets ({err}); restore it or reset "
                                      f"the pipeline") from None

    def check(self, targets: Sequence[Target], *, identity: bool = True) -> None:
        """Raise TargetLostError if a recorded target's table is gone, or (with
        *identity*, which opens each table) is another table now."""
        for target in targets:
            entry = self._entries.get(target.path)
            if entry is None:
                continue
            if identity:
                found = _delta_table_id(target)
            else:
                found = entry.delta_table_id if exists(target) else None
            if found == entry.delta_table_id:
                continue
            what = ("is gone" if found is None else
                    f"is another Delta table now (id {found}, was {entry.delta_table_id})")
            raise TargetLostError(
                f'targets."{target.table}".path: the Delta table {target.path} {what}, but '
                f"the checkpoint {self._checkpoint} has applied changes to it, and the "
                f"stream has moved past them: a new table would hold only later changes. "
                f"Restore the table from a backup, or start the pipeline over: delete the "
                f"checkpoint directory and every target (with no snapshot yet, a new "
                f"pipeline holds only changes made after it starts)")

    def recorded(self) -> dict[str, str]:
        """The recorded targets: table name to Delta table path."""
        return {entry.table: path for path, entry in self._entries.items()}

    def record(self, target: Target) -> None:
        """Note that a batch has written to *target* (once per table)."""
        if target.path in self._entries:
            return
        table_id = _delta_table_id(target)
        if table_id is None:
            return
        self._entries[target.path] = _Entry(target.table, table_id)
        write_atomically(self._file, msgspec.json.encode(self._entries))
        log.debug("recorded target %s (%s) in %s", target.table, target.path, self._file)
