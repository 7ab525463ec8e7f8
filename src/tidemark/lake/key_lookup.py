"""The key index's lookup from a key's hash to the global numbers of the rows holding it:
:class:`Levels`, and :func:`folded`, the pass that makes them one level again.

Each level is a pair of arrays sorted by hash (hashes, row numbers). A batch's entries
merge into the small ``fresh`` level, which merges into ``recent`` past ``_FRESH_MAX``
entries, so a batch copies little. Folding ``recent`` into ``base`` (when it holds half
as many entries) and the key index's rebuild (dead entries dropped, rows renumbered) are
passes over every entry: 1-2 s at 10M rows, measured, which stalled the batch that made
them due. On a big index they run on a background thread (:data:`FOLDER`): the levels
being folded stay searchable (``folding``), new entries go to new levels, and the result
is taken at the start of a later batch (the key index decides when).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from tidemark.lake.key_hashes import merged_levels

_U64 = np.dtype(np.uint64)

#: The fresh level is merged into the recent one past this many entries, so that a batch
#: copies little (at most 4 MB).
_FRESH_MAX = 1 << 18

Level = tuple[np.ndarray[Any, np.dtype[np.uint64]], np.ndarray[Any, np.dtype[np.int64]]]

#: The thread that folds big levels (one: two folds would only compete for the cores).
FOLDER = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                               thread_name_prefix="tidemark-key-index")


def empty() -> Level:
    """A level of no entries."""
    return np.zeros(0, _U64), np.zeros(0, np.int64)


def _without_dead(level: Level, alive: np.ndarray[Any, Any]) -> Level:
    keep = alive[level[1]]
    return level[0][keep], level[1][keep]


@dataclasses.dataclass
class Levels:
    """The lookup levels of one key index (see the module docstring)."""

    base: Level = dataclasses.field(default_factory=empty)
    recent: Level = dataclasses.field(default_factory=empty)
    fresh: Level = dataclasses.field(default_factory=empty)
    folding: tuple[Level, ...] = ()
    """Levels being folded into the next base: searched until it is taken."""

    def all(self) -> tuple[Level, ...]:
        """Every level to search."""
        return *self.folding, self.base, self.recent, self.fresh

    def entries(self) -> int:
        """How many entries the levels hold (dead ones too)."""
        return sum(len(level[0]) for level in self.all())

    def nbytes(self) -> int:
        """The levels' memory, in bytes."""
        return sum(int(a.nbytes) for level in self.all() for a in level)

    def add(self, hashes: np.ndarray[Any, Any], numbers: np.ndarray[Any, Any],
            alive: np.ndarray[Any, Any]) -> None:
        """Add entries (in any order) to the fresh level; past ``_FRESH_MAX`` it is
        merged, without its dead entries, into the recent one."""
        order = np.argsort(hashes, kind="stable")
        self.fresh = merged_levels(self.fresh, (hashes[order], numbers[order]))
        if len(self.fresh[0]) > _FRESH_MAX:
            self.recent = merged_levels(self.recent, _without_dead(self.fresh, alive))
            self.fresh = empty()

    def find(self, hashes: np.ndarray[Any, Any], alive: np.ndarray[Any, Any]
             ) -> tuple[list[np.ndarray[Any, Any]], list[np.ndarray[Any, Any]]]:
        """For sorted *hashes*: per level, the positions in *hashes* of each live entry
        found and its row number."""
        probes, rows = [], []
        for level_h, level_r in self.all():
            if not len(level_h):
                continue
            left = np.searchsorted(level_h, hashes, side="left")
            right = np.searchsorted(level_h, hashes, side="right")
            counts = right - left
            if not counts.any():
                continue
            probe = np.repeat(np.arange(len(hashes), dtype=np.int64), counts)
            first = np.repeat(left - np.cumsum(counts) + counts, counts)
            found = level_r[first + np.arange(len(probe), dtype=np.int64)]
            live = alive[found]
            probes.append(probe[live])
            rows.append(found[live])
        return probes, rows

    def repoint(self, old: np.ndarray[Any, Any], new: np.ndarray[Any, Any]) -> None:
        """Change the row number of the entries pointing at *old* to *new* (in place:
        the hashes, and so each level's order, do not change). Not while folding: the
        fold reads the levels."""
        assert not self.folding, "repoint while a fold runs"
        if not len(old):
            return
        order = np.argsort(old, kind="stable")
        old, new = old[order], new[order]
        for _, numbers in self.all():
            near = np.flatnonzero((numbers >= old[0]) & (numbers <= old[-1]))
            at = np.minimum(np.searchsorted(old, numbers[near]), len(old) - 1)
            hit = old[at] == numbers[near]
            numbers[near[hit]] = new[at[hit]]

    def freeze(self) -> tuple[Level, ...]:
        """Set every level aside to be folded (new entries go to new levels)."""
        self.folding = (self.base, self.recent, self.fresh)
        self.base, self.recent, self.fresh = empty(), empty(), empty()
        return self.folding

    def take(self, base: Level, shift: int = 0) -> None:
        """Take the fold's result as the base; the entries added meanwhile (all of rows
        numbered after the folded ones) move by *shift* with their rows."""
        self.base, self.folding = base, ()
        if shift:
            self.recent = (self.recent[0], self.recent[1] + shift)
            self.fresh = (self.fresh[0], self.fresh[1] + shift)


@dataclasses.dataclass(frozen=True)
class Renumbering:
    """Rows numbered afresh, file after file: a row in the file starting at ``old[i]``
    moves by ``new[i] - old[i]`` (``old`` ascending)."""

    old: np.ndarray[Any, np.dtype[np.int64]]
    new: np.ndarray[Any, np.dtype[np.int64]]

    def __call__(self, numbers: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        at = np.searchsorted(self.old, numbers, side="right") - 1
        return numbers - self.old[at] + self.new[at]


def folded(levels: Sequence[Level], alive: np.ndarray[Any, Any], *, keep_dead_in_first: bool,
           renumbering: Renumbering | None = None) -> Level:
    """*levels* as one level: their dead entries dropped (but the first level's, with
    *keep_dead_in_first*: filtering a 10M-entry base costs more than the lookups that
    skip them), renumbered by *renumbering* if given. Runs on :data:`FOLDER` too: it
    reads *alive*, which the batches may mark meanwhile (an entry dying meanwhile is
    kept or dropped: either is right, lookups skip dead rows)."""
    parts = []
    for at, level in enumerate(levels):
        part = level if keep_dead_in_first and at == 0 else _without_dead(level, alive)
        if renumbering is not None and len(part[1]):
            part = (part[0], renumbering(part[1]))
        parts.append(part)
    result = empty()
    for part in sorted(parts, key=lambda p: len(p[0])):  # the small ones first
        result = merged_levels(part, result) if len(part[0]) >= len(result[0]) \
            else merged_levels(result, part)
    return result
