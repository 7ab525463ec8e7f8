"""The tidemark exception tree.

Every error raised by tidemark derives from :class:`TidemarkError`. Retry logic reads
only the split between :class:`TransientError` (worth retrying: a dropped connection, a
slot still held by a process that is going away) and :class:`TerminalError` (retrying
cannot help: bad configuration, missing privileges, corrupt input).
"""

from __future__ import annotations

from collections.abc import Iterable


class TidemarkError(Exception):
    """Root of all tidemark errors."""


class TransientError(TidemarkError):
    """A failure that may succeed when retried (with backoff)."""


class TerminalError(TidemarkError):
    """A failure that retrying will not fix; the user must change something."""


class ConfigError(TerminalError):
    """A configuration value is missing, unknown or invalid.

    ``key`` names the offending setting; the message says what would be accepted.
    """

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


def unknown_key_error(section: str, key: str, allowed: Iterable[str]) -> ConfigError:
    """The error for a key that is not a known setting of *section*."""
    names = ", ".join(sorted(allowed))
    where = f"{section}." if section else ""
    return ConfigError(f"{where}{key}", f"unknown setting; allowed settings are: {names}")


class DecodeError(TerminalError):
    """Bytes that are not a valid message of the protocol being decoded.

    Carries the message type (a name such as ``"Insert"``, or the raw type byte) and
    the byte offset within the message where decoding failed.
    """

    def __init__(self, message_type: str, offset: int, reason: str,
                 protocol: str = "pgoutput") -> None:
        super().__init__(
            f"cannot decode {protocol} {message_type} message at byte {offset}: {reason}"
        )
        self.message_type = message_type
        self.offset = offset
        self.reason = reason


class SourceError(TerminalError):
    """The source database is not set up the way capture needs (names what to fix)."""


class SourceUnavailableError(TransientError):
    """The source database could not be reached or the connection dropped."""


def first_line(err: BaseException) -> str:
    """The first line of *err*'s message (its class name when it has none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
