"""Install, update and remove PostgreSQL log tables: the DDL and the trigger code.

Per captured table ``s.t``: the log table ``s.t_cdc_log`` (layout in
:mod:`~tidemark.source.logtable.layout`), statement triggers (with transition tables)
that write it, and a TRUNCATE trigger that logs a delete per row (a group's reader must
see each key's removal at its place in that group's order; one "truncate" event per
group could not be placed). Shared, in schema ``tidemark_cdc``: the ``streams``
description, the ``tables`` registry, the ``readers`` and their positions (what
retention may delete), the ``time`` sequence that orders all changes, and the trigger
functions.

Installing is idempotent: run again after ``ALTER TABLE`` it adds the new columns to the
log (or changes their types) and rewrites the triggers, in one transaction; with
``streams`` changed it starts a new generation (all tables' triggers are rewritten in
the same transaction, holding their locks, so no transaction writes the old generation
after the new one starts). Partitioned tables and partitions are refused: a statement
trigger fires for its statement's own target only.

An event trigger (installed where the user may create one, that is a superuser) stops
``ALTER TABLE`` (a rename too: it matches by OID) and ``DROP TABLE`` / ``DROP SCHEMA``
of a captured table unless it runs inside
``tidemark logtable install``'s own transaction, so a column can never be added
without its log following it.
"""

from __future__ import annotations

import contextlib
import logging
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, Final

from psycopg import sql

from tidemark.errors import ConfigError, SourceError
from tidemark.event import TableId, TableSchema
from tidemark.postgres_connection import Connection, cursor
from tidemark.source.logtable import layout
from tidemark.source.postgres.catalog import primary_keys, table_schema

log = logging.getLogger(__name__)

SCHEMA: Final = "tidemark_cdc"
#: The trigger operations; each has trigger ``tidemark_cdc_<op>`` on a captured table.
OPS: Final = ("insert", "update", "delete", "truncate")
STREAMS_TABLE: Final = "streams"
TABLES_TABLE: Final = "tables"
TIME_SEQUENCE: Final = "time"
READERS_TABLE: Final = "readers"
DDL_SETTING: Final = "tidemark.logtable_ddl"

_SHARED = sql.SQL("""
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.{streams} (
    generation integer PRIMARY KEY,
    streams integer NOT NULL,
    groups integer NOT NULL,
    started_xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    started_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS {schema}.{tables} (
    table_schema text NOT NULL,
    table_name text NOT NULL,
    log_table text NOT NULL,
    relid oid NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_schema, table_name));
CREATE TABLE IF NOT EXISTS {schema}.{readers} (
    reader text NOT NULL,
    grp integer NOT NULL,
    position jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (reader, grp));
CREATE SEQUENCE IF NOT EXISTS {schema}.{time} AS bigint CACHE 1;
""")

# Stops DDL on captured tables outside tidemark's own install transaction.
_DDL_GUARD = sql.SQL("""
CREATE OR REPLACE FUNCTION {schema}.ddl_guard() RETURNS event_trigger
LANGUAGE plpgsql AS $fn$
DECLARE cmd record;
BEGIN
  IF current_setting({setting}, true) = 'on' THEN RETURN; END IF;
  FOR cmd IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
    -- By OID: a RENAME or SET SCHEMA reports the table's new name.
    IF cmd.object_type = 'table' AND EXISTS (
        SELECT 1 FROM {schema}.{tables} t WHERE t.relid = cmd.objid) THEN
      RAISE EXCEPTION 'table % is captured by a tidemark log table', cmd.object_identity
        USING HINT = 'change it in the transaction of `tidemark logtable install` '
                     '(--ddl "ALTER TABLE ..."), so that its log table follows, or '
                     'run `tidemark logtable uninstall` first';
    END IF;
  END LOOP;
END $fn$;
CREATE OR REPLACE FUNCTION {schema}.drop_guard() RETURNS event_trigger
LANGUAGE plpgsql AS $fn$
DECLARE obj record;
BEGIN
  IF current_setting({setting}, true) = 'on' THEN RETURN; END IF;
  FOR obj IN SELECT * FROM pg_event_trigger_dropped_objects() LOOP
    IF obj.object_type = 'table' AND EXISTS (
        SELECT 1 FROM {schema}.{tables} t WHERE t.relid = obj.objid) THEN
      RAISE EXCEPTION 'table %.% is captured by a tidemark log table',
        obj.schema_name, obj.object_name
        USING HINT = 'run `tidemark logtable uninstall` for it first';
    END IF;
  END LOOP;
END $fn$;
DROP EVENT TRIGGER IF EXISTS tidemark_cdc_ddl_guard;
CREATE EVENT TRIGGER tidemark_cdc_ddl_guard ON ddl_command_end
  WHEN TAG IN ('ALTER TABLE') EXECUTE FUNCTION {schema}.ddl_guard();
DROP EVENT TRIGGER IF EXISTS tidemark_cdc_drop_guard;
CREATE EVENT TRIGGER tidemark_cdc_drop_guard ON sql_drop
  WHEN TAG IN ('DROP TABLE', 'DROP SCHEMA', 'DROP OWNED')
  EXECUTE FUNCTION {schema}.drop_guard();
""")


@contextlib.contextmanager
def _ddl_transaction(conn: Connection) -> Iterator[Any]:
    """One transaction on an autocommit connection, with the DDL guard let through: a
    cursor, committed at the end of the block (rolled back on an error)."""
    conn.autocommit = False
    try:
        with cursor(conn) as cur:
            cur.execute("SELECT set_config(%s, 'on', true)", (DDL_SETTING,))
            yield cur
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.autocommit = True


def _ident(*parts: str) -> sql.Identifier:
    return sql.Identifier(*parts)


def _shared_names() -> dict[str, Any]:
    return {"schema": _ident(SCHEMA), "streams": _ident(STREAMS_TABLE),
            "tables": _ident(TABLES_TABLE), "time": _ident(TIME_SEQUENCE),
            "readers": _ident(READERS_TABLE),
            "setting": sql.Literal(DDL_SETTING)}


def resolve(conn: Connection, names: Sequence[str]) -> list[TableId]:
    """The tables *names* (``schema.table`` or ``table`` in ``public``) that exist;
    raises ConfigError naming a missing one."""
    tables = [TableId.parse(name) for name in names]
    for table in tables:
        layout.check_name("schema", table.schema)
        layout.check_name("table", table.table)
    with cursor(conn) as cur:
        cur.execute("SELECT n.nspname, c.relname, c.relkind, c.relispartition FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE "
                    "(n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
                    ([t.schema for t in tables], [t.table for t in tables]))
        found = {TableId(s, t): (kind, partition) for s, t, kind, partition in cur.fetchall()}
    for table in tables:
        kind, partition = found.get(table, (None, False))
        if kind is None:
            raise ConfigError("tables", f"table {table} does not exist")
        if kind == "p" or partition:
            # Statement triggers fire for the statement's own target only: a write to a
            # partition would not reach the parent's, nor one through the parent a
            # partition's.
            raise ConfigError("tables", f"table {table} is partitioned or a partition: its "
                              "writes cannot all be logged by statement triggers; capture it "
                              "through logical replication (--source replication)")
        if kind != "r":
            raise ConfigError("tables", f"{table} is not a table (a view or foreign table?)")
    return tables


def installed_tables(conn: Connection) -> list[TableId]:
    """The tables that have a log, in name order (empty when nothing is installed)."""
    with cursor(conn) as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{SCHEMA}.{TABLES_TABLE}",))
        if not cur.fetchone()[0]:
            return []
        cur.execute(sql.SQL("SELECT table_schema, table_name FROM {}.{} ORDER BY 1, 2")
                    .format(_ident(SCHEMA), _ident(TABLES_TABLE)))
        return [TableId(s, t) for s, t in cur.fetchall()]


def current_generation(conn: Connection) -> layout.Generation | None:
    """The newest stream generation, or None before the first install."""
    with cursor(conn) as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{SCHEMA}.{STREAMS_TABLE}",))
        if not cur.fetchone()[0]:
            return None
        cur.execute(sql.SQL("SELECT generation, streams, groups, started_at::text FROM {}.{} "
                            "ORDER BY generation DESC LIMIT 1")
                    .format(_ident(SCHEMA), _ident(STREAMS_TABLE)))
        row = cur.fetchone()
    return None if row is None else layout.Generation(*row)


def captured_schema(conn: Connection, table: TableId) -> TableSchema:
    """*table*'s columns and primary key; raises ConfigError for a table without one."""
    keys = primary_keys(conn, [table]).get(table)
    if not keys:
        raise ConfigError("tables", f"table {table} has no primary key: a log table spreads "
                          "changes over streams by key, and Delta applies them by key; add "
                          "a primary key")
    schema = table_schema(conn, table, keys, generated=True)
    layout.check_columns(str(table), schema.column_names)
    return schema


def install(conn: Connection, names: Sequence[str], *,
            streams: int | None = None, groups: int | None = None,
            ddl: Sequence[str] = ()) -> list[TableId]:
    """Create or update the log tables and triggers of *names* (with none: update every
    installed table), in one transaction; *ddl* statements run first in that same
    transaction (the way to alter a captured table). Returns the tables installed."""
    names_given = list(names)
    if conn.info.server_version < 140000:
        raise ConfigError("dsn", f"PostgreSQL {conn.info.server_version // 10000} cannot hold "
                          "tidemark log tables: they need PostgreSQL 14 or later "
                          "(hash_record_extended, xid8 snapshots); capture it through "
                          "logical replication instead")
    previous = current_generation(conn)
    wanted_streams, wanted_groups = layout.wanted_counts(previous, streams, groups)
    with _ddl_transaction(conn) as cur:
        cur.execute(_SHARED.format(**_shared_names()))
        _install_guard(cur)
        before = _column_names(cur, installed_tables(conn)) if ddl else {}
        for statement in ddl:
            cur.execute(statement)
        if before:
            _follow_renames(cur, before)
        already = installed_tables(conn)
        tables = resolve(conn, names_given) if names_given else list(already)
        everything = sorted(set(tables) | set(already), key=str)
        # Writers of every captured table wait here; those already running finish
        # first, so no change of the old generation commits after the new one.
        for table in everything:
            cur.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE")
                        .format(_ident(table.schema, table.table)))
        generation = previous
        if previous is None or wanted_streams != previous.streams:
            number = 1 if previous is None else previous.number + 1
            cur.execute(sql.SQL("INSERT INTO {}.{} (generation, streams, groups) "
                                "VALUES (%s, %s, %s)")
                        .format(_ident(SCHEMA), _ident(STREAMS_TABLE)),
                        (number, wanted_streams, wanted_groups))
            generation = layout.Generation(number, wanted_streams, wanted_groups)
            if previous is not None:
                log.info("stream generation %d: %d streams in %d groups", number,
                         wanted_streams, wanted_groups)
        assert generation is not None
        rewrite = everything if generation is not previous else tables
        for table in rewrite:
            _install_table(cur, captured_schema(conn, table), generation)
    return tables


def _column_names(cur: Any, tables: Sequence[TableId]
                  ) -> dict[tuple[int, int], tuple[str, str]]:
    """(table OID, attnum) -> (log table as ``schema.name``, column name) of the live
    columns of *tables*."""
    if not tables:
        return {}
    cur.execute(
        "SELECT c.oid, a.attnum, n.nspname, c.relname, a.attname FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[])) "
        "AND a.attnum > 0 AND NOT a.attisdropped",
        ([t.schema for t in tables], [t.table for t in tables]))
    return {(int(oid), int(num)): (f"{schema}.{layout.log_table_name(name)}", str(column))
            for oid, num, schema, name, column in cur.fetchall()}


def _follow_renames(cur: Any, before: dict[tuple[int, int], tuple[str, str]]) -> None:
    """Rename the log columns of the columns *ddl* renamed: an attribute number is the
    column's identity (never reused), so unread log rows keep their values under the
    new name instead of being left in a column the table no longer has."""
    oids = sorted({oid for oid, _ in before})
    cur.execute("SELECT attrelid::bigint, attnum, attname FROM pg_attribute "
                "WHERE attrelid = ANY(%s::oid[]) AND attnum > 0 AND NOT attisdropped",
                (oids,))
    renamed: list[tuple[str, str, str]] = []
    for oid, num, name in cur.fetchall():
        log_table, old = before.get((int(oid), int(num)), ("", str(name)))
        if old != name:
            renamed.append((log_table, old, str(name)))
    # Through temporary names (short: PostgreSQL truncates long ones): renames may swap
    # names (a -> b, b -> a).
    moves = [(log_table, (old, layout.deleted_column(old))[j], f"tidemark_tmp${i}_{j}",
              (new, layout.deleted_column(new))[j])
             for i, (log_table, old, new) in enumerate(renamed) for j in (0, 1)]
    present: set[tuple[str, str]] = set()
    for log_table, source, _, _ in moves:
        cur.execute("SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                    "AND attname = %s AND NOT attisdropped", (_regclass(log_table), source))
        if cur.fetchone() is not None:
            present.add((log_table, source))
    for step in (0, 1):
        for log_table, source, temporary, target in moves:
            if (log_table, source) in present:
                schema, name = log_table.split(".", 1)
                cur.execute(sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(
                    _ident(schema, name), _ident(source if step == 0 else temporary),
                    _ident(temporary if step == 0 else target)))
    for log_table, old, new in renamed:
        log.info("log table %s: column %s follows its table's rename to %s", log_table,
                 old, new)


def _regclass(log_table: str) -> str:
    schema, name = log_table.split(".", 1)
    return '"{}"."{}"'.format(schema.replace('"', '""'), name.replace('"', '""'))


def _install_guard(cur: Any) -> None:
    cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
    if cur.fetchone()[0]:
        cur.execute(_DDL_GUARD.format(**_shared_names()))
    else:
        log.warning("not a superuser: no event trigger guards the captured tables against "
                    "ALTER TABLE; alter them only with `tidemark logtable install --ddl`, or "
                    "the readers stop when a table and its log differ")


def _install_table(cur: Any, schema: TableSchema, generation: layout.Generation) -> None:
    table = schema.table
    log_name = layout.log_table_name(table.table)
    log_id = _ident(table.schema, log_name)
    columns = schema.columns
    value_columns = [sql.SQL("{} {}{}").format(
        _ident(c.name), sql.SQL(_column_type(cur, table, c.name)),
        sql.SQL(" NOT NULL") if c.is_key else sql.SQL("")) for c in columns]
    flags = [sql.SQL("{} boolean").format(_ident(layout.deleted_column(c.name)))
             for c in columns if not c.is_key]
    cur.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {log} ({stream} integer NOT NULL, {group} integer NOT NULL, "
        "{generation} integer NOT NULL, {time} bigint NOT NULL, {batch} integer NOT NULL, "
        "{op} smallint NOT NULL, {txid} xid8 NOT NULL DEFAULT pg_current_xact_id(), "
        "{ts} timestamptz NOT NULL DEFAULT clock_timestamp(), {columns})"
    ).format(log=log_id, stream=_ident(layout.STREAM), group=_ident(layout.GROUP),
             generation=_ident(layout.GENERATION), time=_ident(layout.TIME),
             batch=_ident(layout.BATCH_SEQ),
             op=_ident(layout.OPERATION), txid=_ident(layout.TXID), ts=_ident(layout.TS),
             columns=sql.SQL(", ").join(value_columns + flags)))
    # After ALTER TABLE: bring the log's columns in line (new ones added, changed types
    # changed; dropped ones kept, so that old log rows still read, and written as NULL
    # from now on).
    present = _column_types(cur, table.schema, log_name)
    wanted = _column_types(cur, table.schema, table.table)
    for c in columns:
        if c.name not in present:
            cur.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                log_id, _ident(c.name), sql.SQL(wanted[c.name])))
        elif present[c.name] != wanted[c.name]:
            # Through text: an unread log row keeps its value (or the install fails).
            cur.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {} USING {}::text::{}")
                        .format(log_id, _ident(c.name), sql.SQL(wanted[c.name]),
                                _ident(c.name), sql.SQL(wanted[c.name])))
        if not c.is_key and layout.deleted_column(c.name) not in present:
            cur.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} boolean").format(
                log_id, _ident(layout.deleted_column(c.name))))
    tag = f"{zlib.crc32(f'{table.schema}.{table.table}'.encode()):08x}"
    for index_name, index_columns in ((f"tidemark_cdc_{tag}_group", (layout.GROUP, layout.TIME)),
                                      (f"tidemark_cdc_{tag}_txid", (layout.GROUP, layout.TXID))):
        cur.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
            _ident(index_name), log_id, sql.SQL(", ").join(_ident(c) for c in index_columns)))
    keys = [c.name for c in columns if c.is_key]
    # A key type without a hash function fails here, not at the application's writes.
    cur.execute(sql.SQL("SELECT hash_record_extended(ROW({}), 0) FROM {} LIMIT 1").format(
        sql.SQL(", ").join(_ident(k) for k in keys), _ident(table.schema, table.table)))
    source = _ident(table.schema, table.table)
    for op, statement in _functions(cur, schema, log_id, generation).items():
        cur.execute(statement)
        trigger = _ident(f"tidemark_cdc_{op}")
        cur.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(trigger, source))
        if op == "truncate":
            cur.execute(sql.SQL("CREATE TRIGGER {} BEFORE TRUNCATE ON {} FOR EACH STATEMENT "
                                "EXECUTE FUNCTION {}()").format(
                                    trigger, source, _function(table, op)))
            continue
        transition = {"insert": "NEW TABLE AS new_rows",
                      "update": "OLD TABLE AS old_rows NEW TABLE AS new_rows",
                      "delete": "OLD TABLE AS old_rows"}[op]
        cur.execute(sql.SQL("CREATE TRIGGER {} AFTER {} ON {} REFERENCING {} FOR EACH "
                            "STATEMENT EXECUTE FUNCTION {}()").format(
                                trigger, sql.SQL(op.upper()), source, sql.SQL(transition),
                                _function(table, op)))
    for op in OPS:
        # ALWAYS: also under session_replication_role = replica (a logical replication
        # subscriber applying changes to this table, a restore with disabled triggers).
        cur.execute(sql.SQL("ALTER TABLE {} ENABLE ALWAYS TRIGGER {}").format(
            source, _ident(f"tidemark_cdc_{op}")))
    cur.execute(sql.SQL("INSERT INTO {}.{} (table_schema, table_name, log_table, relid) "
                        "VALUES (%s, %s, %s, %s::regclass) ON CONFLICT DO NOTHING")
                .format(_ident(SCHEMA), _ident(TABLES_TABLE)),
                (table.schema, table.table, log_name, source.as_string(cur)))


def _column_type(cur: Any, table: TableId, column: str) -> str:
    return _column_types(cur, table.schema, table.table)[column]


def _column_types(cur: Any, schema: str, table: str) -> dict[str, str]:
    """``{column: format_type}`` of a table's live columns ({} if it does not exist)."""
    cur.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON "
                "n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s "
                "AND a.attnum > 0 AND NOT a.attisdropped", (schema, table))
    return {str(name): str(kind) for name, kind in cur.fetchall()}


def _text_compared(cur: Any, table: TableId) -> set[str]:
    """Columns whose type (or element type) has no default btree opclass (json, xml,
    point, …): ``IS DISTINCT FROM`` has no operator for them, so they compare as text."""
    cur.execute(
        "SELECT a.attname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
        "AND NOT EXISTS (SELECT 1 FROM pg_opclass o JOIN pg_am m ON m.oid = o.opcmethod "
        "  WHERE m.amname = 'btree' AND o.opcdefault AND o.opcintype IN "
        "  (CASE WHEN t.typelem <> 0 AND t.typcategory = 'A' THEN t.typelem ELSE t.oid END, "
        "   CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END, "
        "   CASE WHEN t.typtype = 'e' THEN 'anyenum'::regtype ELSE t.oid END))",
        (sql.Identifier(table.schema, table.table).as_string(cur),))
    return {str(name) for (name,) in cur.fetchall()}




def _function(table: TableId, op: str) -> sql.Identifier:
    """The trigger function of *table* for *op*: named after the table (cut to fit
    PostgreSQL's 63 bytes), with a hash of the full name so that cut names stay apart."""
    name = f"{table.schema}.{table.table}"
    suffix = f"_{zlib.crc32(name.encode()):08x}#{op}"
    room = layout.MAX_IDENTIFIER - len(suffix.encode())
    head = name.encode()[:room].decode(errors="ignore")
    return _ident(SCHEMA, head + suffix)


def _hash(row: str, keys: Sequence[str]) -> sql.Composable:
    """The key's hash in [0, 2^31). ``hash_record_extended`` hashes the values by their
    types (equal keys hash equal: ``1.50`` and ``1.5``), whatever the writing session's
    TimeZone or DateStyle, so a key always lands in the same group."""
    fields = sql.SQL(", ").join(sql.SQL("{}.{}").format(sql.SQL(row), _ident(k)) for k in keys)
    return sql.SQL("(hash_record_extended(ROW({}), 0) & 2147483647)").format(fields)


def _meta_columns() -> sql.Composable:
    return sql.SQL(", ").join(_ident(c) for c in (layout.STREAM, layout.GROUP,
                                                  layout.GENERATION, layout.TIME,
                                                  layout.BATCH_SEQ, layout.OPERATION))


def _meta_values(row: str, keys: Sequence[str], generation: layout.Generation,
                 batch_seq: int, op: layout.Operation) -> sql.Composable:
    h = _hash(row, keys)
    return sql.SQL("({h} * {n}) >> 31, ({h} * {g}) >> 31, {gen}, "
                   "nextval({seq}), {batch}, {op}").format(
        h=h, n=sql.Literal(generation.streams), g=sql.Literal(generation.groups),
        gen=sql.Literal(generation.number),
        seq=sql.Literal(f'{SCHEMA}."{TIME_SEQUENCE}"'),
        batch=sql.Literal(batch_seq), op=sql.Literal(int(op)))


_SOURCE_MARK: Final = "tidemark_cdc_truncated_table"


def _functions(cur: Any, schema: TableSchema, log_id: sql.Identifier,
               generation: layout.Generation) -> dict[str, sql.Composable]:
    """The statement-level trigger functions of one table, by operation.

    Statement triggers with transition tables write a statement's changes with one
    INSERT … SELECT: several times cheaper than a PL/pgSQL call per row. Each row's
    ``cdc$time`` is still taken after its row lock, which is what orders two
    transactions' changes of one key. An UPDATE that changed keys is split as the
    stream needs it: the keys that disappeared are deleted, the new ones inserted
    (after the deletes), the others updated with only the columns that changed.
    """
    table = schema.table
    text_compared = _text_compared(cur, table)
    keys = [c.name for c in schema.columns if c.is_key]
    others = [c.name for c in schema.columns if not c.is_key]
    all_cols = sql.SQL(", ").join([
        _meta_columns(), *(_ident(c) for c in keys), *(_ident(c) for c in others),
        *(_ident(layout.deleted_column(c)) for c in others)])
    key_cols = sql.SQL(", ").join([_meta_columns(), *(_ident(c) for c in keys)])

    def col(row: str, name: str) -> sql.Composable:
        return sql.SQL("{}.{}").format(sql.SQL(row), _ident(name))

    def same_key(a: str, b: str) -> sql.Composable:
        return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(col(a, k), col(b, k))
                                     for k in keys)

    def inserts(batch_seq: int, where: sql.Composable) -> sql.Composable:
        values = [_meta_values("n", keys, generation, batch_seq, layout.Operation.INSERT),
                  *(col("n", k) for k in keys), *(col("n", c) for c in others),
                  *(sql.SQL("CASE WHEN {} IS NULL THEN true END").format(col("n", c))
                    for c in others)]
        return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM new_rows AS n {};").format(
            log_id, all_cols, sql.SQL(", ").join(values), where)

    def deletes(source: str, where: sql.Composable) -> sql.Composable:
        values = [_meta_values("o", keys, generation, 0, layout.Operation.ROW_DELETE),
                  *(col("o", k) for k in keys)]
        return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} AS o {};").format(
            log_id, key_cols, sql.SQL(", ").join(values), sql.SQL(source), where)

    def differs(c: str) -> sql.Composable:
        if c in text_compared:
            return sql.SQL("{}::text IS DISTINCT FROM {}::text").format(col("n", c), col("o", c))
        return sql.SQL("{} IS DISTINCT FROM {}").format(col("n", c), col("o", c))

    changed = [sql.SQL("CASE WHEN {d} THEN {n} END").format(d=differs(c), n=col("n", c))
               for c in others]
    nulled = [sql.SQL("CASE WHEN {n} IS NULL AND {o} IS NOT NULL THEN true END").format(
        n=col("n", c), o=col("o", c)) for c in others]
    update_values = [_meta_values("n", keys, generation, 0, layout.Operation.UPDATE),
                     *(col("n", k) for k in keys), *changed, *nulled]
    updates = sql.SQL("INSERT INTO {} ({}) SELECT {} FROM new_rows AS n JOIN old_rows AS o "
                      "ON {};").format(log_id, all_cols, sql.SQL(", ").join(update_values),
                                       same_key("o", "n"))
    gone = sql.SQL("WHERE NOT EXISTS (SELECT FROM new_rows AS n WHERE {})").format(
        same_key("o", "n"))
    new = sql.SQL("WHERE NOT EXISTS (SELECT FROM old_rows AS o WHERE {})").format(
        same_key("o", "n"))
    bodies = {
        "insert": inserts(0, sql.SQL("")),
        "update": sql.Composed([deletes("old_rows", gone), sql.SQL(" "), inserts(1, new),
                                sql.SQL(" "), updates]),
        "delete": deletes("old_rows", sql.SQL("")),
    }
    # TRUNCATE: a delete per row, read from the table before it is emptied (holding its
    # exclusive lock, so no write is in flight). Under REPEATABLE READ the transaction's
    # old snapshot would miss rows committed since it began: refused there.
    # The table by its trigger's name for it (a rename must not leave a stale one).
    select = sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} AS o").format(
        log_id, key_cols, sql.SQL(", ").join(
            [_meta_values("o", keys, generation, 0, layout.Operation.ROW_DELETE),
             *(col("o", k) for k in keys)]), _ident(_SOURCE_MARK)).as_string(cur)
    template = select.replace("%", "%%").replace(f'"{_SOURCE_MARK}"', "%I.%I")
    bodies["truncate"] = sql.SQL(
        "IF current_setting('transaction_isolation') <> 'read committed' THEN "
        "RAISE EXCEPTION 'TRUNCATE of %.% (captured by a tidemark log table) needs READ "
        "COMMITTED', TG_TABLE_SCHEMA, TG_TABLE_NAME USING HINT = 'run it in a READ "
        "COMMITTED transaction, or DELETE the rows'; END IF; "
        "EXECUTE format({}, TG_TABLE_SCHEMA, TG_TABLE_NAME);").format(sql.Literal(template))
    return {op: sql.SQL("CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql "
                        "AS $fn$ BEGIN {} RETURN NULL; END $fn$").format(
                            _function(table, op), body)
            for op, body in bodies.items()}


def uninstall(conn: Connection, names: Sequence[str]) -> list[TableId]:
    """Remove the triggers and log tables of *names* (none: all, and the shared schema).
    Unread changes in a removed log are lost, which is what the user asked for."""
    installed = installed_tables(conn)
    tables = [TableId.parse(n) for n in names] if names else installed
    for table in tables:
        if table not in installed:
            raise ConfigError("tables", f"table {table} has no log table to remove")
    with _ddl_transaction(conn) as cur:
        for table in tables:
            source = _ident(table.schema, table.table)
            for op in OPS:
                cur.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                    _ident(f"tidemark_cdc_{op}"), source))
                cur.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(
                    _function(table, op)))
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
                _ident(table.schema, layout.log_table_name(table.table))))
            cur.execute(sql.SQL("DELETE FROM {}.{} WHERE table_schema = %s AND "
                                "table_name = %s")
                        .format(_ident(SCHEMA), _ident(TABLES_TABLE)),
                        (table.schema, table.table))
        if not names or set(tables) == set(installed):
            cur.execute("DROP EVENT TRIGGER IF EXISTS tidemark_cdc_ddl_guard")
            cur.execute("DROP EVENT TRIGGER IF EXISTS tidemark_cdc_drop_guard")
            cur.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(_ident(SCHEMA)))
    return tables


def check_installed(conn: Connection, table: TableId) -> None:
    """Raise SourceError when *table*'s log table is missing."""
    with cursor(conn) as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL",
                    (sql.Identifier(table.schema, layout.log_table_name(table.table))
                     .as_string(cur),))
        if not cur.fetchone()[0]:
            raise SourceError(f"the log table of {table} is missing (dropped?): run "
                              f"`tidemark logtable install` for {table}; changes made "
                              "since it was dropped were not logged")
