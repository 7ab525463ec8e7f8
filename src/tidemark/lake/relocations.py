"""Rows an upkeep rewrite moved from files to new ones: :data:`RELOCATIONS`.

Upkeep rewrites a merge-on-read target's files without their deleted rows
(:mod:`tidemark.lake.vector_compaction`): the new files hold the old files' live rows,
in order. The writer's key index would otherwise read each new file's keys and add them
to its lookup as new rows (and count the old ones dead), and at 10M rows the lookup
merges and rebuilds that follow cost up to a second of the next batch. Told where each
row went, the index keeps its lookup as it is and only points the rows at their new
file and position (:meth:`tidemark.lake.key_index.KeyIndex.sync`).

Nothing here is trusted blindly: the index takes a relocation only when every old file
is one it holds, with the deletion vector the rewrite read, and the new files' row
counts add up; otherwise it reads the new files as any other.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Final

from pyroaring import BitMap64

#: The latest relocations kept per table, for the index of a later batch (upkeep
#: rewrites at most once per batch; a table without a merge-on-read writer in this
#: process never takes them, and each holds a few numbers per file only).
_KEPT: Final = 4


@dataclasses.dataclass(frozen=True)
class MovedFile:
    """An old file whose live rows a rewrite moved, in their order: its path, the unique
    id of the deletion vector the rewrite read (None: none), how many rows it moved
    (those that vector leaves alive) and the vector itself. A rewrite that ran beside
    the batches commits after they deleted more of its rows: the index holds a later
    vector then, and finds the moved rows by this one."""

    path: str
    dv_id: str | None
    rows: int
    vector: BitMap64 | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class Relocation:
    """One rewrite: the live rows of *sources*, file after file, are the rows of
    *outputs* (path, row count), file after file."""

    sources: tuple[MovedFile, ...]
    outputs: tuple[tuple[str, int], ...]

    def consistent(self) -> bool:
        """Whether the outputs hold exactly as many rows as the sources moved."""
        return sum(s.rows for s in self.sources) == sum(rows for _, rows in self.outputs)


class Relocations:
    """The latest rewrites of each table, by the path of a file they made."""

    def __init__(self) -> None:
        self._tables: dict[str, list[Relocation]] = {}

    def note(self, root: Path, relocation: Relocation) -> None:
        """Remember *relocation*, a rewrite just committed to the table at *root*."""
        kept = self._tables.setdefault(os.fspath(root), [])
        kept.append(relocation)
        del kept[:-_KEPT]

    def made(self, root: Path, path: str) -> Relocation | None:
        """The rewrite of the table at *root* that made the file *path*, if noted."""
        for relocation in reversed(self._tables.get(os.fspath(root), [])):
            if any(output == path for output, _ in relocation.outputs):
                return relocation
        return None


RELOCATIONS = Relocations()
