"""Connections to the source database with the session settings decoding relies on.

Values reach tidemark as the text PostgreSQL's output functions print, whose form
depends on session settings. Every connection tidemark opens — snapshot, catalog and
replication alike — uses the same settings, so one set of parsers reads them all.
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg2
import psycopg2.extensions

from tidemark.errors import SourceError, SourceUnavailableError
from tidemark.source.postgres.config import redact_dsn

SESSION_SETTINGS = (
    "-c DateStyle=ISO,MDY -c TimeZone=UTC -c IntervalStyle=iso_8601 "
    "-c extra_float_digits=3 -c bytea_output=hex -c lc_monetary=C"
)


def session_options(dsn: str) -> str:
    """The DSN's own ``options`` followed by tidemark's session settings."""
    existing = psycopg2.extensions.parse_dsn(dsn).get("options", "")
    return f"{existing} {SESSION_SETTINGS}".strip()


#: libpq TCP keepalives: first probe after 10 s idle, then every 5 s, 3 lost = dead.
#: A peer that vanished without a RST (a partition, a host gone) is found in about
#: 25 s instead of the operating system's default two hours.
_TCP_KEEPALIVES = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5",
                   "keepalives_count": "3"}


def keepalive_params(dsn: str) -> dict[str, str]:
    """tidemark's TCP keepalive settings that the DSN does not set itself."""
    given = psycopg2.extensions.parse_dsn(dsn)
    return {key: value for key, value in _TCP_KEEPALIVES.items() if key not in given}


def connect(dsn: str, *, application_name: str = "tidemark") -> psycopg2.extensions.connection:
    """Open an autocommit connection with tidemark's session settings.

    Connection failures become :class:`SourceUnavailableError` (the server could not be
    reached: retrying may help) or :class:`SourceError` (authentication or a missing
    database: it will not), with the password never in the message.
    """
    kwargs: dict[str, Any] = {
        "options": session_options(dsn),
        "application_name": application_name,
        "connect_timeout": psycopg2.extensions.parse_dsn(dsn).get("connect_timeout", "10"),
        **keepalive_params(dsn),
    }
    try:
        conn: psycopg2.extensions.connection = psycopg2.connect(dsn, **kwargs)
    except psycopg2.OperationalError as err:
        raise classify_connect_error(dsn, err) from None
    conn.autocommit = True
    return conn


def classify_connect_error(dsn: str, err: psycopg2.OperationalError) -> Exception:
    """Turn a libpq connection error into a tidemark error without secrets."""
    return classify_connect_message(dsn, str(err))


def classify_connect_message(dsn: str, message: str) -> Exception:
    """Turn libpq's connection error text into a tidemark error without secrets."""
    message = message.strip() or "connection failed"
    safe = redact_dsn(dsn)
    lowered = message.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        user = psycopg2.extensions.parse_dsn(dsn).get("user", "")
        return SourceError(
            f"authentication failed for user {user!r} ({safe}): check the user name and "
            "password (the password is never logged)"
        )
    if "does not exist" in lowered and "database" in lowered:
        return SourceError(f"{message.splitlines()[-1]} ({safe}): create it or fix dbname")
    if "no pg_hba.conf entry" in lowered and "replication" in lowered:
        return SourceError(
            f"the server does not allow replication connections from this host ({safe}): "
            "add a 'host replication <user> <address> scram-sha-256' line to pg_hba.conf"
        )
    return SourceUnavailableError(
        f"cannot connect to PostgreSQL ({safe}): {message.splitlines()[0]}"
    )


def on_standby(conn: psycopg2.extensions.connection) -> bool:
    """Whether *conn* is to a standby (read-only, in recovery): the server reports
    ``in_hot_standby`` on connecting and when it is promoted, so no query is needed."""
    return bool(conn.get_parameter_status("in_hot_standby") == "on")


@contextlib.contextmanager
def cursor(conn: psycopg2.extensions.connection) -> Any:
    """A cursor that is closed afterwards (typed as Any: psycopg2's stubs are loose)."""
    cur = conn.cursor()
    try:
        yield cur
    finally:
        cur.close()
