"""A PostgreSQL column as the text logical replication sends for it: how the log tables'
reader, snapshot and repairs select a value, so that each reads the same text."""

from __future__ import annotations

from psycopg import sql

from tidemark.event import Column
from tidemark.logical_type import Kind


def output_text(column: Column) -> sql.Composable:
    """*column* in its type's output text: a boolean's cast to text is ``true``/``false``
    where its output is ``t``/``f``."""
    name = sql.Identifier(column.name)
    if column.logical.kind is Kind.BOOL:
        return sql.SQL("left({}::text, 1)").format(name)
    return sql.SQL("{}::text").format(name)
