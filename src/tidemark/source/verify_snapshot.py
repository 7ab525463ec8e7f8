"""What ``tidemark verify`` asks of a source: a consistent snapshot of its tables taken
at an exact log position, checksums computed in the database on that snapshot, and the
keys changed after that position (the changes in flight towards the target).

A source's implementation lives in its folder (``source/<kind>/verify_snapshot.py``,
its SQL in ``source/<kind>/checksum.py``) and is opened through
:meth:`tidemark.source.kind.SourceKind.verify_snapshot`. The checksum rules are in
:mod:`tidemark.row_checksum`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from tidemark.errors import SourceError
from tidemark.event import TableId
from tidemark.row_checksum import ChecksumSide, RowTexts, TableShape


class TruncatedAfterSnapshotError(SourceError):
    """A table was truncated after a snapshot's position: which of its rows changed
    cannot be listed. A snapshot taken after the truncate compares it again."""

    def __init__(self, table: TableId) -> None:
        super().__init__(f"{table} was truncated after the verify snapshot: which of its "
                         "rows changed cannot be listed; verify again once the pipeline "
                         "has applied the truncate")
        self.table = table


class VerifySnapshot(Protocol):
    """A snapshot of a source's tables at :attr:`position`, open until :meth:`close`.

    Every change the source committed before :attr:`position` is in the snapshot and
    none after it; :attr:`position` is in the units of
    :meth:`~tidemark.source.kind.SourceKind.log_position`, so that it compares with how
    far a pipeline has committed.
    """

    @property
    def position(self) -> int:
        """The log position the snapshot was taken at."""
        ...

    def side(self, table: TableId) -> ChecksumSide:
        """Checksums of *table* computed in the database on this snapshot."""
        ...

    def changed_key_hashes(self, table: TableId, shape: TableShape) -> frozenset[int]:
        """The key hashes (:func:`tidemark.row_checksum.key_hash_of`) of every row of
        *table* that a change committed after :attr:`position` and before this call
        touched (old and new keys of an update, deleted keys, inserted keys). Raises
        :class:`TruncatedAfterSnapshotError` if a change after :attr:`position`
        truncated *table*."""
        ...

    def close(self) -> None:
        """Release the snapshot and whatever holds the log position (a temporary slot)."""
        ...


@runtime_checkable
class ReachedByOffset(Protocol):
    """A :class:`VerifySnapshot` whose position is not one number in a total order
    (PostgreSQL log tables: a transaction snapshot), so :attr:`VerifySnapshot.position`
    compares with an offset only conservatively; it says itself whether a pipeline's
    offset holds all it holds."""

    def reached_by(self, offset: Mapping[str, Any]) -> bool:
        """Whether a pipeline whose last committed Spark offset is *offset* has every
        change this snapshot holds in its targets."""
        ...


@runtime_checkable
class KeyedChanges(Protocol):
    """A :class:`VerifySnapshot` whose changed keys come with their values (a source
    whose change log decodes them anyway), so that a later round fetches those keys'
    rows by value (:class:`tidemark.row_checksum.KeyLookup`) instead of scanning both
    tables for their hashes."""

    def changed_keys(self, table: TableId, shape: TableShape) -> Mapping[int, RowTexts]:
        """:meth:`VerifySnapshot.changed_key_hashes` as a mapping of each key hash to
        the key columns' canonical texts (in ``shape.keys`` order)."""
        ...
