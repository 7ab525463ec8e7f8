"""Whether a PostgreSQL log table still follows its table: checked at start and at
every prune, where no event trigger guards an ALTER made without ``tidemark logtable
install``."""

from __future__ import annotations

from typing import Any

from psycopg import sql

from tidemark.errors import SourceError
from tidemark.source.logtable import postgres_install as install
from tidemark.source.logtable.database import LogTable


def check_table(cur: Any, entry: LogTable) -> None:
    """Raise SourceError when *entry*'s log no longer follows its table: the log table
    or a trigger missing or disabled, a column the log lacks or types apart."""
    table = entry.table
    log_types = install._column_types(cur, table.schema, entry.log)
    if not log_types:
        raise SourceError(f"the log table {table.schema}.{entry.log} of {table} is missing "
                          f"(dropped?): run `tidemark logtable install` for {table}; changes "
                          "made since it was dropped were not logged")
    # The table as it is now, not as it was when the reader started.
    types = install._column_types(cur, table.schema, table.table)
    missing = [name for name in types if name not in log_types]
    changed = [name for name, kind in types.items()
               if name in log_types and log_types[name] != kind]
    if missing or changed:
        what = (f"column(s) {', '.join(missing)} that its log table {entry.log} lacks"
                if missing else f"column(s) {', '.join(changed)} of another type than in "
                f"its log table {entry.log}")
        raise SourceError(f"table {table} has {what} (ALTER TABLE without the log): changes "
                          "to them were not logged right. Run `tidemark logtable install` for "
                          "the table, then re-load it (changes since the ALTER are incomplete)")
    cur.execute("SELECT t.tgname, t.tgenabled FROM pg_trigger t WHERE t.tgrelid = "
                "%s::regclass AND t.tgname LIKE 'tidemark_cdc_%%'",
                (sql.Identifier(table.schema, table.table).as_string(cur),))
    triggers = dict(cur.fetchall())
    for op in install.OPS:
        state = triggers.get(f"tidemark_cdc_{op}")
        if state is None or state == "D":
            raise SourceError(
                f"the {op} trigger tidemark_cdc_{op} of {table} is "
                f"{'missing' if state is None else 'disabled'}: changes are not logged. Run "
                f"`tidemark logtable install` for {table}, then re-load it")
