"""SCD type 2: fold a batch of changes into versions of rows.

A version is the state of a key between two sequence values: ``__START_AT`` holds the
value of the first ``sequence_by`` column of the change that produced it (for the
default sequence, the commit LSN of its transaction), ``__END_AT`` that of the change
that replaced or deleted it, and is null on the current version. Changes that share
the first sequence value (the changes of one transaction, by default) make a single
version: the states in between were never visible outside the transaction.

A change that only touches columns outside the tracked history columns updates the
current version in place. A key's latest version, open or closed, also serves as its
tombstone: a change at or before it has already been applied and is skipped.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from tidemark.lake import change_rows as cr
from tidemark.lake.collapse import IS_DELETE, PreparedBatch, keep_column, order_by_key
from tidemark.lake.spec import ApplySpec, ResolvedColumns

log = logging.getLogger(__name__)

#: Working column of the merge source: the ``__START_AT`` of the target version a row
#: replaces, null for a new version.
MERGE_START = f"{cr.WORK_PREFIX}merge_start"


@dataclasses.dataclass
class _Version:
    values: dict[str, Any]
    existing_start: Any = None  # __START_AT of the target row this is, None if new
    changed: bool = False


@dataclasses.dataclass(frozen=True)
class VersionPlan:
    """Rows for the merge (new versions and changed existing ones) and what was skipped."""

    rows: list[dict[str, Any]]
    skipped: int
    unknown_kept: frozenset[str]  # kept columns with no value anywhere (left null)


def plan_versions(batch: PreparedBatch, spec: ApplySpec, columns: ResolvedColumns,
                  latest: dict[tuple[Any, ...], dict[str, Any]]) -> VersionPlan:
    """Fold the batch's changes, key by key in sequence order, over *latest* (each
    key's latest target version) into the rows to merge."""
    keys, seq, at = spec.keys, spec.sequence_by, spec.version_column
    data = columns.data
    rows, _ = order_by_key(batch.rows, keys, seq)
    changes = rows.to_pylist()
    truncates = batch.truncates
    out: list[dict[str, Any]] = []
    skipped = 0
    unknown: set[str] = set()
    kept = [(name, keep_column(i)) for i, name in enumerate(batch.keep_columns)]
    tracked = columns.tracked

    def close(version: _Version | None, end: Any) -> None:
        if version is None:
            return
        if version.values[cr.START_AT] == end and version.existing_start is None:
            version.values[cr.END_AT] = _DROPPED  # born and gone in one sequence value
        else:
            version.values[cr.END_AT] = end
        version.changed = True
        emit(version)

    def emit(version: _Version) -> None:
        if version.values[cr.END_AT] is _DROPPED or not version.changed:
            return
        row = {name: version.values.get(name) for name in data}
        row[cr.START_AT] = version.values[cr.START_AT]
        row[cr.END_AT] = version.values[cr.END_AT]
        row[MERGE_START] = version.existing_start
        out.append(row)

    index = 0
    while index < len(changes):
        key = tuple(changes[index][k] for k in keys)
        end = index
        while end < len(changes) and tuple(changes[end][k] for k in keys) == key:
            end += 1
        target = latest.get(key)
        done_up_to = None
        current: _Version | None = None
        if target is not None:
            done_up_to = target[cr.START_AT] if target[cr.END_AT] is None else target[cr.END_AT]
            if target[cr.END_AT] is None:
                current = _Version(dict(target), existing_start=target[cr.START_AT])
        pending = 0  # next truncate to consider for this key
        for change in changes[index:end]:
            value = change[at]
            position = tuple(change[s] for s in seq)
            while pending < len(truncates) and truncates[pending] < position:
                current = _truncate(current, truncates[pending], seq.index(at), close)
                pending += 1
            if done_up_to is not None and value <= done_up_to:
                skipped += 1
                continue
            if change[IS_DELETE]:
                close(current, value)
                current = None
                continue
            image = {name: change[name] for name in data}
            for name, mask in kept:
                if change[mask]:
                    if current is None:
                        unknown.add(name)
                        image[name] = None
                    else:
                        image[name] = current.values.get(name)
            if current is None:
                current = _Version({**image, cr.START_AT: value, cr.END_AT: None}, changed=True)
            elif current.values[cr.START_AT] == value or all(
                current.values.get(name) == image[name] for name in tracked
            ):
                current.values.update(image)  # same transaction, or untracked columns only
                current.changed = True
            else:
                close(current, value)
                current = _Version({**image, cr.START_AT: value, cr.END_AT: None}, changed=True)
        while pending < len(truncates):
            current = _truncate(current, truncates[pending], seq.index(at), close)
            pending += 1
        if current is not None:
            emit(current)
        index = end
    return VersionPlan(rows=out, skipped=skipped, unknown_kept=frozenset(unknown))


_DROPPED = object()


def _truncate(current: _Version | None, truncate: tuple[Any, ...], at: int,
              close: Callable[[_Version | None, Any], None]) -> _Version | None:
    if current is not None and current.values[cr.START_AT] <= truncate[at]:
        close(current, truncate[at])
        return None
    return current
