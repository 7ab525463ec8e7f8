"""Where each live row of a merge-on-read target is: :class:`KeyIndex`.

A merge-on-read batch must find the file and row position of every key it updates or
deletes without reading the table. The index holds, per live data file, the file's key
and sequence columns (read once: Delta data files never change) and which of its rows
are alive (its deletion vector), and one lookup structure from a 64-bit hash of the key
to a global row number. It is built from the table itself at first use in a process and
brought to each later version by the difference of the live file sets
(:meth:`KeyIndex.sync`): files a version removes drop out, files it adds are read, files
whose deletion vector changed lose the rows it marks. A file an upkeep rewrite made of
other files' live rows (:mod:`tidemark.lake.relocations`) has its key columns read but
not hashed: the lookup entries of those rows are pointed at it. Nothing is persisted, so
nothing but the table is trusted.

Memory, per million live rows: the key and sequence columns (8 bytes per integer
column), 17 bytes of lookup (hash, row number, alive flag), and the same again for rows
deleted or replaced since the last rebuild (done when they are a third of the rows); one
byte for each number a moved row left (rebuilt when they are half the numbers).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap64

from tidemark.lake import delta_log
from tidemark.lake.deletion_vector import DeletionVector, read_vector
from tidemark.lake.delta_log import LogState
from tidemark.lake.key_hashes import key_hashes, plain_schema
from tidemark.lake.key_lookup import FOLDER, Level, Levels, Renumbering, folded
from tidemark.lake.relocations import RELOCATIONS, MovedFile, Relocation

log = logging.getLogger(__name__)

#: Rebuild the lookup once this fraction of its entries point at dead rows (and at least
#: _DEAD_MIN of them: small tables are not worth it).
_DEAD_FRACTION = 0.35
_DEAD_MIN = 1 << 16
#: Merge the recent lookup level into the base once it holds this fraction of the base
#: (each batch merges its entries into the recent level, so a bigger one costs a little
#: every batch; a base merge is a pass over every entry, which a rebuild also makes).
_RECENT_FRACTION = 0.5
#: Folds (base merges and rebuilds) of at least this many entries run on the background
#: thread (key_lookup.FOLDER); smaller ones take a few milliseconds in the batch.
_BACKGROUND_MIN = 1 << 20
#: Rebuild once this fraction of the row numbers were left by rows a rewrite moved (no
#: lookup entry points at them; they cost one byte each).
_STALE_FRACTION = 0.5


@dataclasses.dataclass
class _File:
    """One live data file: where its rows start in the global row numbers, its key and
    sequence columns, and the unique id of the deletion vector applied to it."""

    path: str
    start: int
    rows: pa.Table
    dv_id: str | None
    at: int
    """Its place in ``KeyIndex._order`` (a file of no rows shares its start)."""

    @property
    def span(self) -> slice:
        """Its rows' global numbers."""
        return slice(self.start, self.start + len(self.rows))


@dataclasses.dataclass(frozen=True)
class Matches:
    """The live rows found for a table of keys: ``probe[i]`` is the row of the keys
    table, ``row[i]`` the global row number of a target row holding that key."""

    probe: np.ndarray[Any, np.dtype[np.int64]]
    row: np.ndarray[Any, np.dtype[np.int64]]


def _positions(vector: BitMap64) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The row positions of a deletion vector (``to_array``: ~50x faster than a list of a
    large vector's ints, measured)."""
    return np.frombuffer(vector.to_array(), dtype=np.uint64).astype(np.int64)


class KeyIndex:
    """The live rows of one Delta table by key (see the module's docstring)."""

    def __init__(self, root: Path, keys: tuple[str, ...], sequence_by: tuple[str, ...]):
        self.root = root
        self.keys = keys
        self.sequence_by = tuple(s for s in sequence_by if s not in keys)
        self.columns = (*keys, *self.sequence_by)
        self.version = -1
        self.files_read = 0
        """Data files whose keys were read and added to the lookup."""
        self.files_relocated = 0
        """Data files an upkeep rewrite made whose rows took their lookup entries over."""
        self._files: dict[str, _File] = {}
        self._starts: list[int] = []  # ordered by start, with _order's paths
        self._order: list[_File | None] = []
        # The rows' liveness, a view of a buffer with room to grow: a batch's new file
        # appends its rows without copying those of the 10M before (a concatenation
        # was 6% of a soak's batch time).
        self._alive_buffer = np.zeros(0, dtype=bool)
        self._alive = self._alive_buffer
        self._exact = True
        self._levels = Levels()
        self._fold: concurrent.futures.Future[Level] | None = None
        self._take_fold: Callable[[Level], None] | None = None
        self._vectors: dict[str, BitMap64] = {}
        self._dead = 0
        self._stale = 0  # numbers rows had before a rewrite moved them

    # -- building ------------------------------------------------------------------------
    def sync(self, state: LogState) -> None:
        """Bring the index to *state* (the live files of a later version)."""
        if state.version == self.version:
            return
        self._settle(wait=False)
        added: list[pa.Table] = []
        added_starts: list[int] = []
        added_rows: list[np.ndarray[Any, Any]] = []
        self._take_relocations(state)
        for path in [p for p in self._files if p not in state.files]:
            self._drop_file(path)
        for path, action in state.files.items():
            dv_json = action.get("deletionVector")
            dv = DeletionVector.from_json(dv_json) if dv_json else None
            dv_id = dv.unique_id if dv is not None else None
            known = self._files.get(path)
            if known is None:
                entry, rows = self._load_file(path, dv)
                added.append(entry.rows)
                added_starts.append(entry.start)
                added_rows.append(rows)
            elif known.dv_id != dv_id:
                self._apply_vector(known, dv)
        if added:
            self._add_lookup(added, added_starts, added_rows)
        self.version = state.version
        if self._fold is None:
            if self._rebuild_due():
                self._rebuild()
            elif len(self._levels.recent[0]) > _RECENT_FRACTION * len(self._levels.base[0]):
                self._merge_levels()

    def _rebuild_due(self) -> bool:
        return (self._dead > _DEAD_FRACTION * max(len(self._alive), 1)
                or self._stale > _STALE_FRACTION * len(self._alive)) and \
            self._dead + self._stale > _DEAD_MIN

    def _load_file(self, path: str, dv: DeletionVector | None
                   ) -> tuple[_File, np.ndarray[Any, Any]]:
        rows = self._read_columns(path)
        alive = np.ones(len(rows), dtype=bool)
        if dv is not None:
            vector = read_vector(self.root, dv)
            self._vectors[path] = vector
            alive[_positions(vector)] = False
        entry = self._add_file(path, rows, alive, dv.unique_id if dv is not None else None)
        self.files_read += 1
        return entry, np.flatnonzero(alive).astype(np.int64) + entry.start

    def _read_columns(self, path: str) -> pa.Table:
        """The key and sequence columns of the data file *path*, as the index holds them."""
        rows = pq.read_table(self.root / unquote(path), columns=list(self.columns))
        # One chunk per column: a take from a file's row groups as chunks costs the whole
        # file (8 ms instead of 0.6 ms for 4,000 rows of a 10M-row table, measured).
        return rows.cast(pa.schema([f.with_nullable(True) for f in plain_schema(rows.schema)]))\
            .combine_chunks()

    def _add_file(self, path: str, rows: pa.Table, alive: np.ndarray[Any, Any],
                  dv_id: str | None) -> _File:
        """Number the rows of a new live file after the others'."""
        entry = _File(path=path, start=len(self._alive), rows=rows, dv_id=dv_id,
                      at=len(self._order))
        self._files[path] = entry
        self._starts.append(entry.start)
        self._order.append(entry)
        numbered, end = len(self._alive), len(self._alive) + len(alive)
        if end > len(self._alive_buffer):
            # A fold running on the other thread keeps the view it was given.
            buffer = np.zeros(max(end, len(self._alive_buffer) * 3 // 2), dtype=bool)
            buffer[:numbered] = self._alive
            self._alive_buffer = buffer
        self._alive_buffer[numbered:end] = alive
        self._alive = self._alive_buffer[:end]
        return entry

    def _drop_file(self, path: str) -> None:
        entry = self._files.pop(path)
        self._vectors.pop(path, None)
        self._dead += int(self._alive[entry.span].sum())
        self._alive[entry.span] = False
        self._order[entry.at] = None

    # -- rows a rewrite moved -----------------------------------------------------------
    def _take_relocations(self, state: LogState) -> None:
        """Give the files that upkeep rewrites made (see :mod:`tidemark.lake.relocations`)
        the lookup entries of the rows they took over: no hashing, no new entries, no
        dead ones. Each new file's key and sequence columns are read and checked
        against the rows said to be there (a writer that reordered rows would otherwise
        misplace them)."""
        taken: set[str] = set()
        tried: list[Relocation] = []
        for path in state.files:
            if path in self._files or path in taken:
                continue
            relocation = RELOCATIONS.made(self.root, path)
            if relocation is None or any(r is relocation for r in tried):
                continue
            tried.append(relocation)
            if not self._holds(relocation, state):
                continue
            self._settle(wait=True)  # the moved rows' entries are re-pointed in place
            moved = [self._moved_slots(s) for s in relocation.sources]
            slots = np.concatenate([m for m in moved if m is not None])
            found = self._found_rows(relocation, slots)
            if found is None:
                log.warning("%s: the rows of %s are not where its rewrite said: its keys "
                            "are read instead", self.root, path)
                continue
            self._take(relocation, slots, found)
            taken.update(output for output, _ in relocation.outputs)

    def _alive_slots(self, entry: _File) -> np.ndarray[Any, np.dtype[np.int64]]:
        return np.flatnonzero(self._alive[entry.span]).astype(np.int64) + entry.start

    def _moved_slots(self, source: MovedFile) -> np.ndarray[Any, np.dtype[np.int64]] | None:
        """The numbers of the rows *source* says a rewrite moved (those the vector it
        read leaves alive), if the index holds that file with that vector or a later
        one (the batches that ran beside the rewrite deleted more); else None."""
        entry = self._files.get(source.path)
        if entry is None:
            return None
        if entry.dv_id == source.dv_id:
            slots = self._alive_slots(entry)
        elif source.vector is not None and \
                source.vector.issubset(self._vectors.get(source.path, BitMap64())):
            alive = np.ones(len(entry.rows), dtype=bool)
            gone = _positions(source.vector)
            alive[gone[gone < len(alive)]] = False
            slots = np.flatnonzero(alive).astype(np.int64) + entry.start
        else:
            return None
        return slots if len(slots) == source.rows else None

    def _holds(self, relocation: Relocation, state: LogState) -> bool:
        """Whether the index holds exactly the rows *relocation* moved, as rows of files
        *state* removed, and *state* has its new files with their row counts."""
        if not relocation.consistent() or not relocation.sources:
            return False
        for output, rows in relocation.outputs:
            action = state.files.get(output)
            if output in self._files or action is None or \
                    delta_log.num_records(action) != rows:
                return False
        return all(source.path not in state.files and self._moved_slots(source) is not None
                   for source in relocation.sources)

    def _found_rows(self, relocation: Relocation, slots: np.ndarray[Any, Any]
                    ) -> list[pa.Table] | None:
        """Each new file's key and sequence columns, if they hold, row by row, the
        values of the *slots* said to be there (rows equal in them are one to the
        index); None if any does not."""
        found, at = [], 0
        for output, rows in relocation.outputs:
            columns = self._read_columns(output)
            held = self.values(slots[at:at + rows], self.columns)
            try:
                if not columns.equals(held.cast(columns.schema)):
                    return None
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return None  # a column's type changed meanwhile
            found.append(columns)
            at += rows
        return found

    def _take(self, relocation: Relocation, slots: np.ndarray[Any, Any],
              found: list[pa.Table]) -> None:
        """Number the new files' rows and point the lookup entries of *slots* (the
        moved rows' numbers, in the new files' order) at them."""
        for source in relocation.sources:
            entry = self._files.pop(source.path)
            self._vectors.pop(source.path, None)
            self._order[entry.at] = None
        # Rows deleted since the rewrite read them moved too: the new files' vectors
        # mark them dead again (their old numbers, like all the others, are stale).
        self._dead -= int(len(slots) - self._alive[slots].sum())
        self._alive[slots] = False
        self._stale += len(slots)
        moved_to = []
        for (output, _), columns in zip(relocation.outputs, found, strict=True):
            entry = self._add_file(output, columns, np.ones(len(columns), dtype=bool), None)
            moved_to.append(np.arange(entry.start, entry.start + len(columns)))
        self._repoint(slots, np.concatenate(moved_to))
        self.files_relocated += len(relocation.outputs)

    def _repoint(self, old: np.ndarray[Any, Any], new: np.ndarray[Any, Any]) -> None:
        """Change the row number of the lookup entries pointing at *old* to *new*."""
        self._levels.repoint(old, new)

    def _apply_vector(self, entry: _File, dv: DeletionVector | None) -> None:
        # A vector only grows while the file lives (a rewrite makes a new file), so only
        # its rows change: the work follows the vector, not the file's rows.
        vector = read_vector(self.root, dv) if dv is not None else BitMap64()
        self._vectors[entry.path] = vector
        deleted = _positions(vector) + entry.start
        self._dead += int(self._alive[deleted].sum())
        self._alive[deleted] = False
        entry.dv_id = dv.unique_id if dv is not None else None

    def _add_lookup(self, tables: list[pa.Table], starts: list[int],
                    rows: list[np.ndarray[Any, Any]]) -> None:
        """Add the alive *rows* (global numbers) of files whose key columns are *tables*
        and whose rows start at *starts* to the lookup."""
        taken = [t.select(list(self.keys)).take(pa.array(r - s))
                 for t, s, r in zip(tables, starts, rows, strict=True) if len(r)]
        if not taken:
            return
        hashes, exact = key_hashes(pa.concat_tables(taken))
        self._exact = self._exact and exact
        self._levels.add(hashes, np.concatenate([r for r in rows if len(r)]), self._alive)

    # -- folds: base merges and rebuilds -----------------------------------------------
    def _start_fold(self, keep_dead_in_first: bool, renumbering: Renumbering | None,
                    take: Callable[[Level], None]) -> None:
        """Fold every level into a new base, which *take* installs: on the background
        thread if the index is big (taken by a later :meth:`sync`), here if not."""
        levels = self._levels.freeze()
        alive = self._alive
        entries = sum(len(level[0]) for level in levels)

        def work() -> Level:
            return folded(levels, alive, keep_dead_in_first=keep_dead_in_first,
                          renumbering=renumbering)

        if entries < _BACKGROUND_MIN:
            take(work())  # a failure leaves no fold pending (the caller drops the index)
            return
        self._take_fold = take
        self._fold = FOLDER.submit(work)
        log.debug("%s: key index folding %d entries in the background", self.root, entries)

    def _settle(self, wait: bool) -> None:
        """Install a finished fold (with *wait*, wait for a running one first)."""
        if self._fold is None or not (wait or self._fold.done()):
            return
        fold, take = self._fold, self._take_fold
        self._fold = self._take_fold = None
        assert take is not None
        take(fold.result())  # a fold that failed fails the sync: the index is dropped

    def _merge_levels(self) -> None:
        """Merge the recent levels (without their dead entries) into the base: a linear
        merge of sorted arrays. The base's dead entries stay until a rebuild: the
        lookups skip them, and filtering 10M entries here would stall a batch."""
        self._start_fold(True, None, self._levels.take)

    def _rebuild(self) -> None:
        """Renumber the live files' rows without the dropped files' (their rows were
        the dead weight) and drop the dead entries of the lookup: linear in the entries,
        no hashing or sorting (filtering keeps the order). The files added while it
        runs in the background keep their rows' order after the renumbered ones."""
        files = [f for f in self._order if f is not None]
        old = np.asarray([f.start for f in files], dtype=np.int64)
        sizes = np.asarray([len(f.rows) for f in files], dtype=np.int64)
        new = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if files \
            else np.zeros(0, np.int64)
        numbered, slots, dead = len(self._alive), len(self._order), self._dead

        def take(base: Level) -> None:
            later = self._order[slots:]  # files added since the rebuild began
            shift = int(sizes.sum()) - numbered
            self._alive = self._alive_buffer = np.concatenate(
                [self._alive[f.start:f.start + len(f.rows)] for f in files]
                + [self._alive[numbered:]])
            # A file dropped meanwhile keeps its place (its rows are dead): a slot of None.
            order = [f if self._files.get(f.path) is f else None for f in files]
            starts = new.tolist() + [s + shift for s in self._starts[slots:]]
            self._order = order + later
            for at, entry in enumerate(self._order):
                if entry is not None:
                    entry.start, entry.at = starts[at], at
            self._starts = starts
            self._dead -= dead
            self._stale = 0
            self._levels.take(base, shift)
            log.debug("%s: key index rebuilt (%d rows)", self.root, int(self._alive.sum()))

        self._start_fold(False, Renumbering(old, new), take)

    # -- reading ------------------------------------------------------------------------
    def lookup(self, keys: pa.Table) -> Matches:
        """The live rows holding each key of *keys* (columns: the index's keys)."""
        hashes, _ = key_hashes(keys.select(list(self.keys)))
        # Probing in hash order: the searches walk the level forward (half the time of
        # probing in key order into 10M rows, measured); matches come in hash order.
        order = np.argsort(hashes, kind="stable").astype(np.int64)
        probes, rows = self._levels.find(hashes[order], self._alive)
        if not probes:
            empty = np.zeros(0, np.int64)
            return Matches(empty, empty)
        matches = Matches(order[np.concatenate(probes)], np.concatenate(rows))
        if not self._exact and len(matches.row):
            matches = self._exact_matches(keys, matches)
        return matches

    def _exact_matches(self, keys: pa.Table, matches: Matches) -> Matches:
        found = self.values(matches.row, self.keys)
        wanted = keys.select(list(self.keys)).take(pa.array(matches.probe))
        same = np.ones(len(matches.row), dtype=bool)
        for name in self.keys:
            equal = pc.equal(found.column(name), wanted.column(name).cast(
                found.schema.field(name).type))
            same &= np.asarray(pc.fill_null(equal, False).to_numpy(zero_copy_only=False),
                               dtype=bool)
        return Matches(matches.probe[same], matches.row[same])

    def values(self, rows: np.ndarray[Any, Any], columns: Iterable[str]) -> pa.Table:
        """The key/sequence *columns* of the given global *rows*, in their order."""
        names = list(columns)
        if not len(rows):
            any_file = next(iter(self._files.values()), None)
            if any_file is None:
                raise ValueError("the index holds no file")
            return any_file.rows.select(names).slice(0, 0)
        where = np.searchsorted(self._starts, rows, side="right") - 1
        order = np.argsort(where, kind="stable")
        parts = []
        for file_at in np.unique(where):
            entry = self._order[int(file_at)]
            assert entry is not None
            picked = rows[order][where[order] == file_at] - entry.start
            parts.append(entry.rows.select(names).take(pa.array(picked)))
        table = pa.concat_tables(parts, promote_options="permissive")
        back = np.empty(len(rows), dtype=np.int64)
        back[order] = np.arange(len(rows))
        return table.take(pa.array(back))

    def locate(self, rows: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
        """The global *rows* grouped by data file: path -> row positions in the file."""
        where = np.searchsorted(self._starts, rows, side="right") - 1
        out: dict[str, np.ndarray[Any, Any]] = {}
        for file_at in np.unique(where):
            entry = self._order[int(file_at)]
            assert entry is not None
            out[entry.path] = np.sort(rows[where == file_at] - entry.start)
        return out

    def vector(self, path: str) -> BitMap64:
        """The rows a live file's deletion vector marks (the index keeps each file's
        vector: with spread changes a batch grows every file's, and reading them from
        their files grew with the table's files). Not to be changed: copy it."""
        return self._vectors.get(path) or BitMap64()

    def note_vector(self, path: str, dv: DeletionVector, vector: BitMap64,
                    added: np.ndarray[Any, Any]) -> None:
        """Take the vector *dv* (marking *vector*'s rows) this process just wrote for
        *path*, grown by the positions *added*: the next :meth:`sync` finds it applied
        and does not read it back."""
        entry = self._files[path]
        deleted = added.astype(np.int64) + entry.start
        self._dead += int(self._alive[deleted].sum())
        self._alive[deleted] = False
        self._vectors[path] = vector
        entry.dv_id = dv.unique_id

    def alive_rows(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The global numbers of every live row."""
        return np.flatnonzero(self._alive).astype(np.int64)

    def file_rows(self, path: str) -> int:
        """The physical row count of a live file."""
        return len(self._files[path].rows)

    def live_rows(self) -> int:
        """How many rows are alive."""
        return int(self._alive.sum())

    def memory_bytes(self) -> int:
        """What the index holds in memory, in bytes."""
        held = sum(int(f.rows.nbytes) for f in self._files.values())
        return held + int(self._alive_buffer.nbytes) + self._levels.nbytes()
