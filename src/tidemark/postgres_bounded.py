"""PostgreSQL connections whose every wait for the server has a deadline.

Kept apart from :mod:`tidemark.postgres_connection` because the classes here subclass
psycopg's, so defining them imports psycopg (about 0.1 s, several times that where no
bytecode is cached): that module loads this one only when a connection is opened with
a deadline, or when :class:`ServerTimeoutError` is asked for.
"""

from __future__ import annotations

from typing import Any

import psycopg


class ServerTimeoutError(psycopg.OperationalError):
    """PostgreSQL did not answer within the connection's ``server_timeout_s``."""

    @classmethod
    def after(cls, seconds: float) -> ServerTimeoutError:
        return cls(f"no answer from PostgreSQL within {seconds:.0f} s (serverTimeoutMs): "
                   "the server is stopped or unreachable")


class BoundedConnection(psycopg.Connection[Any]):
    """A connection whose every wait for the server ends after ``server_timeout_s``.

    psycopg waits for an answer as long as it takes; a stopped server (its kernel still
    acknowledges TCP, so keepalives see nothing wrong) or a partition that swallows
    packets would hold a query, and with it its caller, forever.
    """

    server_timeout_s: float | None = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        if timeout is not None or self.server_timeout_s is None:
            return super().wait(gen, interval, timeout)
        try:
            return super().wait(gen, interval, self.server_timeout_s)
        except psycopg.errors.OperationalError as err:
            if type(err).__name__ != "_WaitTimeout":
                raise
            # The protocol state is unknown after an abandoned wait: the connection goes.
            self.pgconn.finish()
            raise ServerTimeoutError.after(self.server_timeout_s) from None
