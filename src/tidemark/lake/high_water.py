"""A Delta table's high-water mark: the highest sequence tidemark applied to it, kept in
the metadata of the commit that applied it (:data:`HIGH_WATER_KEY`), so a batch replayed
after a crash drops the changes the table already holds."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
from typing import Any, Final

import pyarrow as pa
from deltalake import DeltaTable

from tidemark.lake.collapse import PreparedBatch
from tidemark.lake.spec import ApplySpec

log = logging.getLogger(__name__)

#: Commit-metadata key of the high-water mark: the highest sequence applied so far.
HIGH_WATER_KEY: Final = "tidemark.highWater"


def batch_high_water(batch: PreparedBatch, spec: ApplySpec) -> tuple[Any, ...]:
    """The highest sequence of *batch* (its rows' and its truncates')."""
    seq = spec.sequence_by
    candidates = list(batch.truncates)
    if len(batch.rows):
        top = batch.rows.select(list(seq)).sort_by([(s, "descending") for s in seq])
        row = top.slice(0, 1).to_pylist()[0]
        candidates.append(tuple(row[s] for s in seq))
    return max(candidates)


def _encode_value(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


def encode_high_water(spec: ApplySpec, values: tuple[Any, ...]) -> str:
    """The commit-metadata text of the mark *values* (read by :func:`read_high_water`)."""
    return json.dumps({"sequence_by": list(spec.sequence_by),
                       "values": [_encode_value(v) for v in values]})


def read_high_water(table: DeltaTable, spec: ApplySpec,
                    schema: pa.Schema) -> tuple[Any, ...] | None:
    """The highest sequence applied to *table* by tidemark, from its latest commits."""
    # Upkeep commits at most once between two batches: the mark is almost always in the
    # last three. history() reads each commit it returns, and a merge-on-read commit
    # lists every file it touched (150 KB at 120 files): fifty of them are megabytes.
    for limit in (1, 3, 50):
        commits = sorted(table.history(limit), key=lambda c: c.get("version", -1),
                         reverse=True)
        for commit in commits:
            text = commit.get(HIGH_WATER_KEY)
            if text is None:
                continue
            mark = json.loads(text)
            if mark.get("sequence_by") != list(spec.sequence_by):
                log.warning("%s was applied with sequence_by %s, now %s; ignoring its "
                            "high-water mark", table.table_uri, mark.get("sequence_by"),
                            list(spec.sequence_by))
                return None
            return tuple(
                pa.array([value]).cast(schema.field(name).type)[0].as_py()
                for name, value in zip(spec.sequence_by, mark["values"], strict=True)
            )
    return None
