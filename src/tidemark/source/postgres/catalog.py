"""What the source's catalog says: prerequisites, captured tables, their columns and keys.

Every check that can fail raises :class:`tidemark.errors.SourceError` with a message
that names the setting, role or table at fault and says how to fix it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from tidemark.errors import SourceError
from tidemark.event import TableId, TableSchema
from tidemark.postgres_connection import Connection, cursor
from tidemark.source.postgres.types import (
    ARRAY_ELEMENT_OID,
    TEXT_ARRAY_OID,
    TEXT_OID,
    pg_column,
)

log = logging.getLogger(__name__)

BUILTIN_OIDS = frozenset(ARRAY_ELEMENT_OID) | frozenset(ARRAY_ELEMENT_OID.values())
ARRAY_OID_OF = {element: array for array, element in ARRAY_ELEMENT_OID.items()}
_SYSTEM_SCHEMAS = ("pg_catalog", "information_schema", "pg_toast")
_REGEX_META = re.compile(r"[\\^$.|?*+()\[\]{}]")
_NO_IDENTITY = {"d": "has no primary key and REPLICA IDENTITY DEFAULT",
                "n": "has REPLICA IDENTITY NOTHING",
                "i": "has REPLICA IDENTITY USING INDEX of an index that no longer exists"}


def check_wal_level(conn: Connection) -> None:
    """Fail unless ``wal_level`` is ``logical``."""
    with cursor(conn) as cur:
        cur.execute("SHOW wal_level")
        (level,) = cur.fetchone()
    if level != "logical":
        raise SourceError(
            f"wal_level is {level!r} but logical decoding needs wal_level = logical: run "
            "ALTER SYSTEM SET wal_level = logical (or set it in postgresql.conf) and "
            "restart PostgreSQL"
        )


def check_replication_privilege(conn: Connection) -> None:
    """Fail unless the current role may use replication (REPLICATION or superuser)."""
    with cursor(conn) as cur:
        cur.execute(
            "SELECT current_user, rolreplication OR rolsuper FROM pg_roles "
            "WHERE rolname = current_user"
        )
        user, allowed = cur.fetchone()
    if not allowed:
        raise SourceError(
            f"role {user!r} may not use logical replication: grant it with "
            f'ALTER ROLE "{user}" WITH REPLICATION (as a superuser)'
        )


def check_read_privileges(
    conn: Connection, tables: Sequence[TableId]
) -> None:
    """Fail unless the current role may read every one of *tables*.

    The snapshot reads them; and even without one, a role should not receive the changes
    of a table it may not read (Debezium asks for SELECT too). Checked before the
    publication and the slot exist: failing on the snapshot's first SELECT would leave
    a new slot behind, holding WAL.
    """
    if not tables:
        return
    with cursor(conn) as cur:
        cur.execute(
            "SELECT format('%%I.%%I', w.s, w.t), quote_ident(w.s), "
            "has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT'), "
            "quote_ident(current_user) "
            "FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS w(s, t, ord) "
            "JOIN pg_namespace n ON n.nspname = w.s "
            "JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.t "
            "ORDER BY w.ord",
            ([t.schema for t in tables], [t.table for t in tables]),
        )
        rows = cur.fetchall()
    if not rows:
        return
    role = rows[0][4]
    schemas = list(dict.fromkeys(schema for _, schema, usage, _, _ in rows if not usage))
    hidden = [name for name, _, usage, _, _ in rows if not usage]
    unreadable = [name for name, _, _, select, _ in rows if not select]
    problems = []
    if schemas:
        problems.append(
            f"role {role} lacks the USAGE privilege on schema(s) {', '.join(schemas)} of "
            f"table(s) {', '.join(hidden)}: grant it with GRANT USAGE ON SCHEMA "
            f"{', '.join(schemas)} TO {role}"
        )
    if unreadable:
        problems.append(
            f"role {role} lacks the SELECT privilege on table(s) {', '.join(unreadable)}, "
            f"which capturing a table needs: grant it with GRANT SELECT ON "
            f"{', '.join(unreadable)} TO {role}"
        )
    if problems:
        raise SourceError("; ".join(problems) + " (as the tables' owner or a superuser)")


def current_database(conn: Connection) -> str:
    with cursor(conn) as cur:
        cur.execute("SELECT current_database()")
        name: str = cur.fetchone()[0]
        return name


def resolve_tables(
    conn: Connection,
    include: Sequence[str],
    exclude: Sequence[str] = (),
) -> list[TableId]:
    """The captured tables, in Debezium's snapshot order: every ``include`` entry
    resolved against the catalog, in the list's order.

    An entry that is a plain ``schema.table`` name must exist; an entry that is a
    regular expression must match at least one table. ``exclude`` patterns remove
    tables. An empty ``include`` means every ordinary table outside system schemas.
    """
    with cursor(conn) as cur:
        cur.execute(
            "SELECT n.nspname, c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition "
            "AND n.nspname <> ALL(%s) AND n.nspname NOT LIKE 'pg_temp%%' "
            "ORDER BY 1, 2",
            (list(_SYSTEM_SCHEMAS),),
        )
        # Debezium's snapshot order: the include list's, each entry's tables sorted by
        # their schema.table name (as a string, like its TableId); all by name without
        # an include list.
        existing = sorted((TableId(s, t) for s, t in cur.fetchall()), key=str)
    database = current_database(conn)
    chosen: list[TableId] = []
    if not include:
        # Publishing a table without a replica identity would make PostgreSQL refuse its
        # UPDATEs and DELETEs; "every table" means every table that can be published.
        chosen = _skip_unpublishable(conn, existing, "the empty table include list")
    for entry in include:
        if not _is_pattern(entry):
            table = TableId.parse(entry)
            if table not in existing:
                raise SourceError(
                    f"table {table} not found in database {database!r}: check the name "
                    "(schema.table, case-sensitive) in the table include list"
                )
            matches = [table]
        else:
            pattern = re.compile(entry)
            matches = [t for t in existing if pattern.fullmatch(str(t))]
            if not matches:
                raise SourceError(
                    f"no table in database {database!r} matches the include pattern "
                    f"'{entry}': patterns are regular expressions matched against the whole "
                    "schema.table name; fix the pattern in the table include list"
                )
        chosen.extend(m for m in matches if m not in chosen)
    excluded = [re.compile(p) for p in exclude]
    return [t for t in chosen if not any(p.fullmatch(str(t)) for p in excluded)]


def tables_without_identity(
    conn: Connection, tables: Iterable[TableId]
) -> dict[TableId, str]:
    """The *tables* whose UPDATEs and DELETEs PostgreSQL refuses once they are published
    (``cannot update table ... because it does not have a replica identity``), each with
    the reason and the fix, ready for a message.

    That is a table without primary key under REPLICA IDENTITY DEFAULT, one under
    NOTHING, or one USING INDEX of an index since dropped. For a partitioned table its
    partitions count: publishing it publishes them, and their identity is their own.
    """
    tables = list(tables)
    if not tables:
        return {}
    with cursor(conn) as cur:
        cur.execute(
            "SELECT w.s, w.t, p.oid = c.oid, format('%%I.%%I', pn.nspname, p.relname), "
            "p.relreplident "
            "FROM unnest(%s::text[], %s::text[]) AS w(s, t) "
            "JOIN pg_namespace n ON n.nspname = w.s "
            "JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = w.t "
            "CROSS JOIN LATERAL (SELECT relid FROM pg_partition_tree(c.oid) "
            "  WHERE isleaf AND c.relkind = 'p' UNION ALL SELECT c.oid WHERE c.relkind <> 'p'"
            ") AS tree(relid) "
            "JOIN pg_class p ON p.oid = tree.relid "
            "JOIN pg_namespace pn ON pn.oid = p.relnamespace "
            "WHERE p.relkind = 'r' AND NOT ("
            "  p.relreplident = 'f'"
            "  OR p.relreplident = 'd' AND EXISTS (SELECT 1 FROM pg_index i "
            "    WHERE i.indrelid = p.oid AND i.indisprimary)"
            "  OR p.relreplident = 'i' AND EXISTS (SELECT 1 FROM pg_index i "
            "    WHERE i.indrelid = p.oid AND i.indisreplident)) "
            "ORDER BY 1, 2, 4",
            ([t.schema for t in tables], [t.table for t in tables]),
        )
        rows = cur.fetchall()
    refused: dict[TableId, str] = {}
    for schema, name, itself, leaf, ident in rows:
        table = TableId(schema, name)
        if table in refused:
            continue  # one partition is reason enough
        subject = f"table {table}" if itself else f"partition {leaf} of table {table}"
        refused[table] = (
            f"{subject} {_NO_IDENTITY.get(ident, 'has no replica identity')}, so PostgreSQL would "
            "refuse its UPDATEs and DELETEs once it is published: add a primary key, or "
            f"ALTER TABLE {leaf} REPLICA IDENTITY FULL, or create a unique index on NOT "
            f"NULL columns and ALTER TABLE {leaf} REPLICA IDENTITY USING INDEX <that index>"
        )
    return refused


def publishable_tables(
    conn: Connection, tables: Sequence[TableId], include: Sequence[str]
) -> list[TableId]:
    """*tables* without those PostgreSQL cannot publish UPDATEs and DELETEs of.

    Publishing such a table breaks the application, not just the capture: its own
    UPDATEs and DELETEs fail from then on, even after tidemark exits. A table named in
    *include* (``schema.table``) is an error: the user asked for exactly that table, and
    capturing less than asked without failing would go unnoticed. A table matched only
    through a pattern is left out with a warning: a pattern means "the tables like
    this", and one table without identity should not stop the rest.

    Such a table is refused even when a publication FOR ALL TABLES already publishes it:
    the application's UPDATEs and DELETEs fail already, so capture would see its INSERTs
    only, which is better said than delivered.
    """
    refused = tables_without_identity(conn, tables)
    if not refused:
        return list(tables)
    named = {TableId.parse(entry) for entry in include if not _is_pattern(entry)}
    explicit = [refused[t] for t in tables if t in refused and t in named]
    if explicit:
        raise SourceError("cannot capture without harming the application: "
                          + "; ".join(explicit))
    return _skip_unpublishable(conn, tables, "a table pattern", refused)


def _skip_unpublishable(conn: Connection, tables: Sequence[TableId],
                        matched_by: str, refused: dict[TableId, str] | None = None
                        ) -> list[TableId]:
    """*tables* without those PostgreSQL cannot publish, each logged at WARNING (the
    default level shows it): the user asked for them, if not by name."""
    if refused is None:
        refused = tables_without_identity(conn, tables)
    for table in tables:
        if table in refused:
            log.warning("skipped %s (matched by %s, not named): %s", table, matched_by,
                        refused[table])
    return [t for t in tables if t not in refused]


def _is_pattern(entry: str) -> bool:
    """Whether a table include entry is a regular expression rather than a name."""
    return bool(_REGEX_META.search(entry.replace(".", "", 1)))


def primary_keys(
    conn: Connection, tables: Iterable[TableId]
) -> dict[TableId, tuple[str, ...]]:
    """Primary-key columns per table, in key order; tables without one are absent."""
    tables = list(tables)
    if not tables:
        return {}
    with cursor(conn) as cur:
        cur.execute(
            "SELECT n.nspname, c.relname, array_agg(a.attname ORDER BY k.ord) "
            "FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum "
            "WHERE i.indisprimary AND (n.nspname, c.relname) IN "
            "(SELECT * FROM unnest(%s::text[], %s::text[])) "
            "GROUP BY 1, 2",
            ([t.schema for t in tables], [t.table for t in tables]),
        )
        return {TableId(s, t): tuple(cols) for s, t, cols in cur.fetchall()}


def not_null_columns(conn: Connection, table: TableId) -> frozenset[str]:
    """Names of the table's NOT NULL columns."""
    with cursor(conn) as cur:
        cur.execute(
            "SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND a.attnotnull "
            "AND NOT a.attisdropped",
            (table.schema, table.table),
        )
        return frozenset(name for (name,) in cur.fetchall())


def type_info(conn: Connection, oid: int) -> tuple[str, int]:
    """(name, decoding OID) of a type.

    The decoding OID is the built-in type whose text form the type shares: a domain
    decodes as its base type, an enum as text, an array of either as an array of that
    (``mood[]`` as ``text[]``). Built-in types decode as themselves.
    """
    with cursor(conn) as cur:
        cur.execute(
            "WITH RECURSIVE base(oid, depth) AS ("
            "  SELECT %s::oid, 0"
            "  UNION ALL SELECT t.typbasetype, b.depth + 1 FROM base b"
            "  JOIN pg_type t ON t.oid = b.oid WHERE t.typtype = 'd' AND b.depth < 10) "
            "SELECT format_type(%s::oid, NULL), t.oid, t.typtype, t.typcategory, t.typelem, "
            "e.typtype, e.typbasetype "
            "FROM base b JOIN pg_type t ON t.oid = b.oid "
            "LEFT JOIN pg_type e ON e.oid = t.typelem "
            "ORDER BY b.depth DESC LIMIT 1",
            (oid, oid),
        )
        row = cur.fetchone()
    if row is None:
        return str(oid), oid
    name, base, typtype, category, element, element_type, element_base = row
    if int(base) in BUILTIN_OIDS:
        return str(name), int(base)
    if category == "A" and element:
        if element_type == "d" and int(element_base) in BUILTIN_OIDS:
            array = ARRAY_OID_OF.get(int(element_base))
            if array is not None:
                return str(name), array
        return str(name), TEXT_ARRAY_OID
    del typtype  # enums, ranges, composites and extension types decode as their text
    return str(name), TEXT_OID


def table_schema(
    conn: Connection, table: TableId, key: Sequence[str] | None,
    *, generated: bool = False,
) -> TableSchema:
    """The current columns of *table* from the catalog (used by the snapshot): the
    columns the stream carries, so stored generated columns only with *generated* (a
    publication that publishes them, :func:`publishes_generated`)."""
    kinds = "('', 's')" if generated else "('')"
    with cursor(conn) as cur:
        cur.execute(
            "SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, NULL), "
            "c.relreplident, a.attnotnull "
            "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 "
            f"AND NOT a.attisdropped AND a.attgenerated IN {kinds} ORDER BY a.attnum",
            (table.schema, table.table),
        )
        rows: list[Any] = cur.fetchall()
    if not rows:
        raise SourceError(f"table {table} not found (was it dropped?)")
    key = tuple(key or ())
    decoding = {int(oid): type_info(conn, int(oid))[1] for _, oid, *_ in rows}
    columns = tuple(
        pg_column(name, decoding[int(oid)], int(typmod), str(tname), name in key,
                  not notnull)
        for name, oid, typmod, tname, _, notnull in rows
    )
    names = [c.name for c in columns]
    return TableSchema(table, columns, tuple(names.index(k) for k in key), str(rows[0][4]))


def warn_about_keyless(
    conn: Connection, tables: Iterable[TableId],
    keys: dict[TableId, tuple[str, ...]],
) -> None:
    """Log tables whose updates and deletes PostgreSQL cannot publish or we cannot key."""
    for table in tables:
        if table in keys:
            continue
        with cursor(conn) as cur:
            cur.execute(
                "SELECT c.relreplident FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                (table.schema, table.table),
            )
            (ident,) = cur.fetchone()
        if ident in ("d", "n"):
            log.warning(
                "table %s has no primary key and REPLICA IDENTITY %s: PostgreSQL will "
                "refuse its UPDATEs and DELETEs while it is published; add a primary key "
                "or ALTER TABLE %s REPLICA IDENTITY FULL", table,
                "DEFAULT" if ident == "d" else "NOTHING", table,
            )
        else:
            log.warning("table %s has no primary key: its events have no key", table)


def publishes_generated(conn: Connection, publication: str) -> bool:
    """Whether *publication* sends stored generated columns (PostgreSQL 18's
    ``publish_generated_columns = stored``)."""
    if conn.info.server_version < 180000:
        return False
    with cursor(conn) as cur:
        cur.execute("SELECT pubgencols = 's' FROM pg_publication WHERE pubname = %s",
                    (publication,))
        row = cur.fetchone()
    return bool(row and row[0])


def warn_about_unstreamed(conn: Connection,
                          tables: Iterable[TableId], *,
                          generated_published: bool = False) -> None:
    """Say at start what of *tables* the stream cannot keep current: generated columns
    that the publication does not send (left out of every event, snapshot rows
    included, so a target never gets a NULL or a stale value for them; virtual ones
    always), and for partitioned tables the partition operations that reach no stream
    (PostgreSQL publishes row changes only)."""
    names = [str(t) for t in tables]
    if not names:
        return
    with cursor(conn) as cur:
        cur.execute(
            "SELECT format('%%I.%%I', n.nspname, c.relname), c.relkind, "
            "array_remove(array_agg(a.attname::text ORDER BY a.attnum) FILTER "
            "(WHERE a.attgenerated <> '' AND NOT (%s AND a.attgenerated = 's')), NULL) "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 "
            "AND NOT a.attisdropped "
            "WHERE format('%%s.%%s', n.nspname, c.relname) = ANY(%s) "
            "GROUP BY 1, 2 ORDER BY 1", (generated_published, names))
        rows = cur.fetchall()
    for table, kind, generated in rows:
        if generated:
            log.warning(
                "table %s: generated column(s) %s are left out of its events (PostgreSQL "
                "publishes stored generated columns from version 18 on, through a "
                "publication with publish_generated_columns = stored, and virtual ones "
                "never): compute them downstream", table, ", ".join(generated))
        if kind == "p":
            log.info(
                "table %s is partitioned: its partitions' rows stream under its name, and "
                "partitions created later are included; TRUNCATE of one partition, "
                "ATTACH PARTITION of a table with rows and DETACH PARTITION change no "
                "row in the stream: re-snapshot the table after one (tidemark signal "
                "execute-snapshot %s; a tidemark run target is reloaded)", table, table)


def warn_about_identity_index(conn: Connection,
                              tables: Iterable[TableId],
                              keys: dict[TableId, tuple[str, ...]]) -> None:
    """Warn about tables whose ``REPLICA IDENTITY USING INDEX`` is not on their primary
    key: PostgreSQL then sends a delete (and an update of the index's columns) with
    the index's columns only, so the event's key (the primary key) is null."""
    keyed = {str(t): t for t in tables if keys.get(t)}
    if not keyed:
        return
    with cursor(conn) as cur:  # one query for all tables: this runs at every start
        cur.execute(
            "SELECT format('%%s.%%s', n.nspname, c.relname), "
            "array_agg(a.attname::text ORDER BY a.attnum) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n "
            "ON n.oid = c.relnamespace JOIN pg_attribute a ON a.attrelid = c.oid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indisreplident "
            "AND format('%%s.%%s', n.nspname, c.relname) = ANY(%s) GROUP BY 1 ORDER BY 1",
            (list(keyed),))
        rows = cur.fetchall()
    for name, columns in rows:
        table, index = keyed[name], tuple(columns)
        key = keys[table]
        if set(index) != set(key):
            log.warning(
                "table %s has REPLICA IDENTITY USING INDEX on (%s), not on its primary key "
                "(%s): its deletes arrive without the primary key, so their events have a "
                "null key and a target keyed by (%s) cannot apply them; use ALTER TABLE %s "
                "REPLICA IDENTITY DEFAULT (or FULL), or key the target by (%s)", table,
                ", ".join(index), ", ".join(key), ", ".join(key), table, ", ".join(index))


def wal_position(conn: Connection) -> int:
    """Where the server's WAL ends now (on a standby, where replay is): every
    transaction committed before it is visible to a catalog read that starts after."""
    with cursor(conn) as cur:
        cur.execute("SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
                    "ELSE pg_current_wal_insert_lsn() END - '0/0')::bigint")
        return int(cur.fetchone()[0])


def column_layout(conn: Connection, table: TableId, publication: str,
                  *, generated: bool = False
                  ) -> tuple[int, list[tuple[str, int] | None]] | None:
    """The table's OID and, in attnum order, ``(name, type OID)`` of each column the
    stream carries and ``None`` for each dropped one (generated columns the
    publication does not send are left out, as from the stream); None when
    *publication* sends a column list of the table, which may have changed since."""
    kinds = "('', 's')" if generated else "('')"
    with cursor(conn) as cur:
        cur.execute(
            "SELECT c.oid, a.attname, a.atttypid, a.attisdropped "
            "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 "
            f"AND (a.attisdropped OR a.attgenerated IN {kinds}) ORDER BY a.attnum",
            (table.schema, table.table),
        )
        rows: list[Any] = cur.fetchall()
        if not rows:
            raise SourceError(f"table {table} not found (was it dropped?)")
        if conn.info.server_version >= 150000:
            cur.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_publication_rel r JOIN pg_publication p "
                "ON p.oid = r.prpubid WHERE p.pubname = %s AND r.prrelid = %s "
                "AND r.prattrs IS NOT NULL)", (publication, rows[0][0]))
            if cur.fetchone()[0]:
                return None
    return int(rows[0][0]), [None if dropped else (str(name), int(oid))
                             for _, name, oid, dropped in rows]
