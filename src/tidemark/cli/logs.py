"""Logging for the ``tidemark`` command: tidemark's level for tidemark's loggers only,
and no secret in any line.

``--log-level debug`` used to set the root logger, which let every library log at
DEBUG: py4j logs each command it sends to the JVM, including the Spark source's options,
DSN and password among them. Other libraries stay at WARNING, and every line passes a
formatter that masks what looks like a password, whoever logged it.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Final

_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: ``password=…`` / ``sslpassword = '…'`` in a key/value DSN (quoted or not), and the
#: password of a ``postgresql://user:password@host`` URI.
_SECRETS: Final = (
    re.compile(r"(\w*password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'\",;)]+)", re.IGNORECASE),
    re.compile(r"(\w+://[^:/@\s]+:)([^@\s]+)(@)"),
)


def redact(text: str) -> str:
    """*text* with anything that looks like a password replaced by ``***``."""
    text = _SECRETS[0].sub(r"\1***", text)
    return _SECRETS[1].sub(r"\1***\3", text)


class RedactingFormatter(logging.Formatter):
    """A formatter whose output (message, arguments and traceback) has no password."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def configure(level: str) -> None:
    """Send logs to stderr: tidemark's at *level*, other libraries' at WARNING."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter(_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("tidemark").setLevel(level.upper())
