"""The failures a verify reports as its error (exit 2, in ``verify.json``) instead of a
traceback: tidemark's own errors, and what the databases and libraries a verify reads
through raise (a missing table or grant, a column a dialect cannot read, an
unreachable server), each named with the table and the step that failed."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Final

import duckdb
import psycopg
import pymysql

from tidemark.errors import TidemarkError
from tidemark.row_checksum import UnsupportedColumnError

#: What a verify turns into its error rather than letting escape.
FAILURES: Final[tuple[type[Exception], ...]] = (
    TidemarkError, OSError, UnsupportedColumnError, psycopg.Error, pymysql.Error,
    sqlite3.Error, duckdb.Error)

# MariaDB's error codes for a missing privilege, and the one verify needs.
_ACCESS_DENIED: Final = frozenset({1044, 1142, 1227})


class VerifyStepError(TidemarkError):
    """A step of a verify failed (the message names the table and the step)."""


def describe(err: BaseException) -> str:
    """*err* as a line: its library and kind, its message, and the fix where known."""
    if isinstance(err, UnsupportedColumnError | TidemarkError):
        return str(err)
    text = " ".join(str(err).split()) or type(err).__name__
    library = type(err).__module__.split(".")[0]
    line = f"{library} {type(err).__name__}: {text}"
    code = err.args[0] if isinstance(err, pymysql.Error) and err.args else None
    if code in _ACCESS_DENIED:
        line += ("; verify's MariaDB user needs SELECT on the table and CREATE TEMPORARY "
                 "TABLES on its database (for the keys changed during a verify), e.g. "
                 "GRANT SELECT, CREATE TEMPORARY TABLES ON db.* TO user")
    return line


@contextlib.contextmanager
def failing(step: str) -> Iterator[None]:
    """Turn a failure of *step* (e.g. ``comparing public.t``) into a
    :class:`VerifyStepError` naming it; tidemark's own errors pass unchanged."""
    try:
        yield
    except TidemarkError:
        raise
    except FAILURES as err:
        raise VerifyStepError(f"{step} failed: {describe(err)}") from err
