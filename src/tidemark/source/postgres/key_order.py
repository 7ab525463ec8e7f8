"""Reading a table in key order through its index, whatever the table's statistics.

A chunk of a table read in key order (``WHERE (k) > (…) AND (k) <= (…) ORDER BY k LIMIT n``)
has one sensible plan: walk a btree index on the key from the lower bound and stop after
*n* rows. Its cost does not depend on the table's size. The planner finds that plan only
when it knows how many rows the range holds. Right after a bulk load, before
autovacuum's ANALYZE, it does not: it takes the range for a few rows and answers with a
bitmap heap scan of the whole range plus a top-N sort, which reads the rest of the table
for every chunk (26 ms instead of 0.2 ms in the middle of a 300k-row table).

So the chunk's transaction turns off the plans that read a whole range
(:data:`INDEX_ORDER_SETTINGS`, local to the transaction), but only where an index gives
the key's order: without one those plans are the only ones, and the settings would just
make the planner pick among them at a penalty.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

import psycopg
from psycopg import sql

from tidemark.event import TableId

log = logging.getLogger(__name__)

#: Statements (one string, no parameters) that leave the planner the index scan for a
#: query ordered by an indexed key; local to the transaction they run in.
INDEX_ORDER_SETTINGS: Final = ("SET LOCAL enable_seqscan = off; "
                               "SET LOCAL enable_bitmapscan = off; "
                               "SET LOCAL enable_sort = off")

# A valid, non-partial btree index whose leading columns are the key's columns, each
# ascending with its type's default operator class and the column's collation: a scan
# of it returns the rows in the order ``ORDER BY key`` asks for.
_ORDERED_INDEX: Final = """
SELECT i.indexrelid::regclass::text
FROM pg_index i
JOIN pg_class ic ON ic.oid = i.indexrelid
JOIN pg_am am ON am.oid = ic.relam AND am.amname = 'btree'
WHERE i.indrelid = %(table)s::regclass AND i.indisvalid AND i.indpred IS NULL
  AND i.indnkeyatts >= cardinality(%(key)s::text[])
  AND NOT EXISTS (
    SELECT FROM generate_subscripts(%(key)s::text[], 1) p
    LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attname = (%(key)s::text[])[p]
    LEFT JOIN pg_opclass opc ON opc.oid = i.indclass[p - 1]
    WHERE a.attnum IS DISTINCT FROM i.indkey[p - 1]
       OR i.indoption[p - 1] & 1 <> 0
       OR NOT coalesce(opc.opcdefault, false)
       OR i.indcollation[p - 1] IS DISTINCT FROM a.attcollation)
ORDER BY i.indisprimary DESC, i.indnkeyatts
LIMIT 1
"""


def ordered_index(conn: psycopg.Connection[Any], table: TableId,
                  key: Sequence[str]) -> str | None:
    """The name of an index of *table* that returns its rows in *key* order, or None."""
    with conn.cursor() as cur:
        cur.execute(_ORDERED_INDEX, {
            "table": sql.Identifier(table.schema, table.table).as_string(conn),
            "key": list(key)})
        row = cur.fetchone()
    return None if row is None else str(row[0])


class IndexOrder:
    """What a chunk's transaction sets for *key*'s order: :data:`INDEX_ORDER_SETTINGS`
    (as ``; …`` to append to its BEGIN) where an index has the order, else nothing and
    a warning, once per table and key. *what* names the reader in the warning."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._known: dict[tuple[TableId, tuple[str, ...]], bool] = {}

    def settings(self, conn: psycopg.Connection[Any], table: TableId,
                 key: tuple[str, ...]) -> str:
        indexed = self._known.get((table, key))
        if indexed is None:
            indexed = self._known[(table, key)] = ordered_index(conn, table, key) is not None
            if not indexed:
                log.warning("%s of %s: no btree index has the chunk key (%s) as its leading "
                            "columns in ascending order, so each chunk may read the rest of "
                            "the table; create one (CREATE INDEX ON %s (%s)) for chunks that "
                            "cost the same wherever they are", self.what, table,
                            ", ".join(key), table, ", ".join(key))
        return f"; {INDEX_ORDER_SETTINGS}" if indexed else ""

    def clear(self) -> None:
        """Forget what was looked up (a new connection: the indexes may have changed)."""
        self._known.clear()
