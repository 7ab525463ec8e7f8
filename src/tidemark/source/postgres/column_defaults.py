"""What the rows that existed before ``ALTER TABLE … ADD COLUMN`` hold in that column.

``ADD COLUMN c text DEFAULT 'x'`` gives every existing row ``'x'`` without writing them,
so logical replication sends nothing for them: a copy downstream must fill the value
itself. PostgreSQL keeps it as the column's *missing value* (``attmissingval``) until
the table is next rewritten. When there is none but the column has a default — a
volatile default (``now()``, ``random()``) rewrote the table with a value per row, or a
later rewrite cleared it — the existing rows' values cannot be known from the stream,
and that is said loudly instead of leaving them null in silence.
"""

from __future__ import annotations

import decimal
import json
import logging
from collections.abc import Sequence
from typing import Any

from tidemark.event import TableId

log = logging.getLogger(__name__)

_QUERY = """
SELECT a.attname, a.atthasmissing, pg_get_expr(d.adbin, d.adrelid),
       CASE WHEN a.atthasmissing THEN array_to_json(a.attmissingval)::text END
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = %s AND c.relname = %s AND a.attname = ANY(%s) AND a.attnum > 0
  AND NOT a.attisdropped
"""


def existing_row_values(conn: Any, table: TableId, columns: Sequence[str]) -> dict[str, Any]:
    """Column -> the value rows older than the column hold, for those of *columns* that
    have one (a DB-API connection: psycopg 2 or 3). Columns with a default but no
    missing value are logged at WARNING; columns without a default are null there,
    which is what the target has anyway."""
    with conn.cursor() as cur:
        cur.execute(_QUERY, (table.schema, table.table, list(columns)))
        rows = cur.fetchall()
    values: dict[str, Any] = {}
    for name, has_missing, default, missing in rows:
        if has_missing and missing is not None:
            (value,) = json.loads(missing, parse_float=decimal.Decimal)
            if value is not None:
                values[name] = value
        elif default is not None:
            log.warning(
                "%s gained column %r with DEFAULT %s, but PostgreSQL keeps no single value "
                "for the rows that existed before (a volatile default gave each row its own "
                "value, or the table was rewritten since): those rows read null in the "
                "target until they change; copy them from the source to fill them",
                table, name, default)
    return values
