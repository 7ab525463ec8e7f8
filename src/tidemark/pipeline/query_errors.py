"""How a pipeline's streaming query ends: its failures as one line, the stops that are
not failures, and the failures that are only PostgreSQL being out of reach."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from typing import Final

from tidemark.errors import TerminalError


class PipelineError(TerminalError):
    """The streaming query stopped with an error (the message is Spark's first line)."""


class StopBeforeBatch(Exception):  # noqa: N818 - not an error: how a stop ends the query
    """Raised by a batch that starts after a stop was requested (see ``BatchApply._process``)."""


STOPPED_BEFORE: Final = "stop requested before batch"


class QuietStops(logging.Filter):
    """py4j logs an exception a batch raised, with its traceback, at ERROR: not when a
    stop ended the batch (:class:`StopBeforeBatch`, or a batch stopped at once)."""

    def __init__(self, now: threading.Event) -> None:
        super().__init__()
        self._now = now

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info:
            return True
        return not (self._now.is_set() or isinstance(record.exc_info[1], StopBeforeBatch))




_TIDEMARK_ERROR = re.compile(r"tidemark\.[\w.]*?(?:Error|Exception): (.+)")
#: The last line of a Python traceback: ``package.module.SomeError: message``.
_RAISED = re.compile(r"^\s*(?:[\w]+\.)*(\w*(?:Error|Exception|Shutdown|Failure)): (.+)$",
                     re.MULTILINE)
#: What PostgreSQL being down, restarting or cut off looks like, from psycopg, libpq and
#: tidemark's own connect errors, inside a Spark exception's text.
_UNAVAILABLE = re.compile(
    r"SourceUnavailableError|AdminShutdown|CannotConnectNow|ConnectionFailure|"
    r"OperationalError|terminating connection due to administrator command|"
    r"server closed the connection unexpectedly|the database system is (?:starting up|"
    r"shutting down|in recovery mode|not yet accepting connections)|Connection refused|"
    r"connection is (?:lost|closed)|consuming input failed|could not receive data from server|"
    r"SSL SYSCALL error|EOF detected|ServerTimeoutError|"
    # A snapshot's export ended with its connection: the restarted query starts the
    # snapshot's next generation.
    r"SnapshotLostError")


def source_unavailable(err: BaseException) -> bool:
    """True if the query failed because PostgreSQL could not be reached."""
    with contextlib.suppress(Exception):
        return bool(_UNAVAILABLE.search(str(err)))
    return False


def message_of(err: BaseException) -> str:
    """The tidemark error inside a Spark exception's text, else its first line."""
    with contextlib.suppress(Exception):
        text = str(err).strip()
        found = _TIDEMARK_ERROR.findall(text)
        if found:
            return str(found[-1]).strip()
        # A Python traceback from the source or a batch: its last "SomeError: message"
        # line says what happened; the first line is only "Traceback (most recent …".
        raised = _RAISED.findall(text)
        if raised:
            name, message = raised[-1]
            return f"{name}: {message.strip()}"
        return text.splitlines()[0] if text else type(err).__name__
    return type(err).__name__
