"""Connections to PostgreSQL (psycopg 3), with the session settings decoding relies on.

Values reach tidemark as the text PostgreSQL's output functions print, whose form
depends on session settings. Every connection tidemark opens — snapshot, catalog,
offsets, Spark peeks and replication alike — uses the same settings, so one set of
parsers reads them all. :func:`connect` is the one way to open one; it lives in the
core so that every layer (offsets, sources, Spark, pipeline) can use it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

from tidemark.errors import ConfigError, SourceError, SourceUnavailableError

if TYPE_CHECKING:
    import psycopg

    from tidemark.postgres_bounded import (
        ServerTimeoutError as ServerTimeoutError,  # noqa: PLC0414 - re-exported
    )

# psycopg is imported where it is used, not here: loading it costs about 0.1 s (several
# times that where no bytecode is cached), which sources, offsets and commands that never
# connect to PostgreSQL (MariaDB, SQLite log tables, the Spark source's driver-side
# process) would pay for nothing just by importing their configuration.

Connection: TypeAlias = "psycopg.Connection[Any]"
"""A psycopg 3 connection as :func:`connect` returns it (rows are tuples)."""

SESSION_SETTINGS = (
    "-c DateStyle=ISO,MDY -c TimeZone=UTC -c IntervalStyle=iso_8601 "
    "-c extra_float_digits=3 -c bytea_output=hex -c lc_monetary=C"
)

#: libpq TCP keepalives: first probe after 10 s idle, then every 5 s, 3 lost = dead.
#: A peer that vanished without a RST (a partition, a host gone) is found in about
#: 25 s instead of the operating system's default two hours.
_TCP_KEEPALIVES = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5",
                   "keepalives_count": "3"}

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def parse_dsn(dsn: str) -> dict[str, str]:
    """The ``key: value`` parameters of a libpq connection string or URI.

    Raises ``psycopg.ProgrammingError`` if *dsn* is not one.
    """
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415 - see the imports

    return {key: str(value) for key, value in conninfo_to_dict(dsn).items()
            if value is not None}


def make_dsn(dsn: str, **params: Any) -> str:
    """*dsn* with *params* set (replacing the same keys), as a ``key=value`` string."""
    from psycopg.conninfo import make_conninfo  # noqa: PLC0415 - see the imports

    return make_conninfo(dsn, **params)


def redact_dsn(dsn: str) -> str:
    """Return *dsn* as ``key=value`` pairs without any secret (password, sslpassword …)."""
    import psycopg  # noqa: PLC0415 - see the imports

    try:
        params = parse_dsn(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable connection string>"
    return " ".join(f"{k}={v}" for k, v in params.items() if "password" not in k)


def check_identifier(key: str, value: object) -> str:
    """Return *value* if it is a plain PostgreSQL name safe to put in SQL, else raise a
    ConfigError naming *key* and the allowed form."""
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise ConfigError(
            key,
            f"{value!r} is not a valid name: use 1-63 lower-case letters, digits and "
            "underscores, starting with a letter or underscore",
        )
    return value






def __getattr__(name: str) -> Any:
    # ServerTimeoutError subclasses psycopg's OperationalError: defining it loads psycopg,
    # so it is defined (in tidemark.postgres_bounded) only when someone asks for it.
    if name == "ServerTimeoutError":
        from tidemark.postgres_bounded import ServerTimeoutError  # noqa: PLC0415

        return ServerTimeoutError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def connect(dsn: str, *, application_name: str = "tidemark",
            server_timeout_s: float | None = None) -> Connection:
    """Open an autocommit connection with tidemark's session settings and keepalives.

    With *server_timeout_s*, no wait for the server lasts longer
    (:class:`ServerTimeoutError`, and the connection is closed). Connection failures
    become :class:`SourceUnavailableError` (the server could not be reached: retrying
    may help) or :class:`SourceError` (authentication or a missing database: it will
    not), with the password never in the message.
    """
    import psycopg  # noqa: PLC0415 - see the imports

    conninfo = session_conninfo(dsn, application_name=application_name)
    try:
        if server_timeout_s is None:
            return psycopg.Connection.connect(conninfo, autocommit=True)
        from tidemark.postgres_bounded import BoundedConnection  # noqa: PLC0415

        conn = BoundedConnection.connect(conninfo, autocommit=True)
    except psycopg.OperationalError as err:
        raise classify_connect_error(dsn, err) from None
    conn.server_timeout_s = server_timeout_s
    return conn


def session_conninfo(dsn: str, *, application_name: str, **extra: Any) -> str:
    """*dsn* with tidemark's session settings, keepalives, a 10 s connect timeout (unless
    it sets its own) and *extra* parameters: what every tidemark connection opens with
    (:func:`connect`, and the replication connection, which adds
    ``replication=database``)."""
    params = parse_dsn(dsn)
    return make_dsn(dsn, options=f"{params.get('options', '')} {SESSION_SETTINGS}".strip(),
                    application_name=application_name,
                    connect_timeout=params.get("connect_timeout") or "10",
                    **{key: value for key, value in _TCP_KEEPALIVES.items()
                       if key not in params},
                    **extra)


def server_timeout(conn: Connection) -> float | None:
    """The longest wait for the server a :func:`connect` connection allows (None: any)."""
    timeout: float | None = getattr(conn, "server_timeout_s", None)
    return timeout


def classify_connect_error(dsn: str, err: BaseException) -> Exception:
    """Turn a libpq connection error into a tidemark error without secrets."""
    return classify_connect_message(dsn, str(err))


def classify_connect_message(dsn: str, message: str) -> Exception:
    """Turn libpq's connection error text into a tidemark error without secrets."""
    message = message.strip() or "connection failed"
    safe = redact_dsn(dsn)
    lowered = message.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        user = parse_dsn(dsn).get("user", "")
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


def on_standby(conn: Connection) -> bool:
    """Whether *conn* is to a standby (read-only, in recovery): the server reports
    ``in_hot_standby`` on connecting and when it is promoted, so no query is needed."""
    return conn.info.parameter_status("in_hot_standby") == "on"


@contextlib.contextmanager
def cursor(conn: Connection) -> Iterator[Any]:
    """A cursor that is closed afterwards (typed as Any: rows are read positionally)."""
    with conn.cursor() as cur:
        yield cur
