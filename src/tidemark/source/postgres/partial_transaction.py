"""Where an unfinished transaction was left off, so a restart does not repeat it.

PostgreSQL streams a transaction again from its start after a restart: the slot's
position can only be a transaction boundary. A capture stopped in the middle of a large
transaction (600k rows: most of it handed on) would deliver all of it again. Debezium
keeps the last processed event beside the last commit in its offset and skips up to it;
tidemark does the same with the transaction's commit LSN and the number of its change
messages (Insert, Update, Delete, Truncate, logical Message) already handed on. A count,
not an LSN: the rows of one COPY share an LSN.

On a restart the skipped messages are still decoded (the builder keeps its relations and
transaction counters right), only their output is dropped.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from collections.abc import Sequence
from typing import Any, Final

from tidemark.source.postgres.pgoutput import lsn_to_str

log = logging.getLogger(__name__)

#: pgoutput message kinds that become change events.
_CHANGE_KINDS: Final = frozenset(b"IUDTM")
_BEGIN: Final = ord("B")
_COMMIT: Final = ord("C")
_FINAL_LSN: Final = struct.Struct(">Q")  # Begin: final (commit) LSN right after the kind

#: Offset fields: the open transaction's commit LSN and its change messages handed on.
COMMIT_LSN_KEY: Final = "partial_commit_lsn"
MESSAGES_KEY: Final = "partial_messages"

Message = tuple[bytes, int]


def open_transaction_messages(messages: Sequence[Message], previous: int) -> int:
    """Change messages of the transaction open at the end of *messages*, given
    *previous* of it before them (only meaningful while a transaction is open)."""
    count = 0
    for payload, _ in reversed(messages):
        kind = payload[0]
        if kind == _BEGIN:
            return count
        if kind in _CHANGE_KINDS:
            count += 1
    return previous + count


def partial_of(offset: dict[str, Any] | None) -> tuple[int, int] | None:
    """``(commit LSN, messages)`` of an offset saved in the middle of a transaction."""
    if not offset or COMMIT_LSN_KEY not in offset:
        return None
    return int(offset[COMMIT_LSN_KEY]), int(offset[MESSAGES_KEY])


@dataclasses.dataclass
class Skipper:
    """Drops the first *remaining* change messages of the transaction committing at
    *commit_lsn*, if it is the first transaction the stream sends."""

    commit_lsn: int
    remaining: int
    active: bool = False
    done: bool = False
    skipped: int = 0

    def split(self, messages: list[Message]) -> tuple[list[Message], list[Message]]:
        """*messages* as (already handed on, new)."""
        for i, (payload, _) in enumerate(messages):
            kind = payload[0]
            if not self.active:
                if kind == _BEGIN:
                    if _FINAL_LSN.unpack_from(payload, 1)[0] != self.commit_lsn:
                        log.warning("the transaction left unfinished at %s is not the first "
                                    "one streamed; nothing is skipped",
                                    lsn_to_str(self.commit_lsn))
                        self.done = True
                        return [], messages
                    self.active = True
                continue
            if kind == _COMMIT:  # shorter than the count: keep the rest as it comes
                self.done = True
                return messages[:i], messages[i:]
            if kind in _CHANGE_KINDS:
                self.remaining -= 1
                self.skipped += 1
                if self.remaining == 0:
                    self.done = True
                    log.info("skipped %d change messages of the transaction committing at "
                             "%s, handed on before the restart", self.skipped,
                             lsn_to_str(self.commit_lsn))
                    return messages[:i + 1], messages[i + 1:]
        return messages, []
