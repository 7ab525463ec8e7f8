"""Where a MariaDB capture is in the binary log, and how that is stored as an offset.

A position names both forms a server understands: the GTID state (one
``domain-server-sequence`` per replication domain, the last transaction applied;
survives failover to a replica, which has other file names) and the binlog file and
byte position of the next event (exact on this server). Offsets are taken only between
transactions, so a resumed capture never re-reads part of a transaction.

For ordering, a position maps to one int64 that grows with the binlog:
``file number << 32 | byte position`` (a binlog file is at most 1 GiB, its number at
most 6 digits). This is what tidemark's change rows carry as ``_lsn``/``_commit_lsn``
for MariaDB, as the LSN is for PostgreSQL.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from tidemark.errors import ConfigError

_GTID: Final = re.compile(r"^(\d+)-(\d+)-(\d+)$")
_FILE_NUMBER: Final = re.compile(r"\.(\d+)$")


def parse_gtid_state(text: str) -> dict[int, tuple[int, int]]:
    """``"0-1-100,1-2-7"`` -> ``{domain: (server_id, sequence)}``; raises ConfigError
    naming the malformed entry."""
    state: dict[int, tuple[int, int]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _GTID.match(part)
        if match is None:
            raise ConfigError("gtid", f"{part!r} is not of the form "
                              "domain-server_id-sequence (for example 0-1-100)")
        domain, server, sequence = (int(g) for g in match.groups())
        state[domain] = (server, sequence)
    return state


def format_gtid_state(state: dict[int, tuple[int, int]]) -> str:
    """The inverse of :func:`parse_gtid_state`, domains in order."""
    return ",".join(f"{d}-{s}-{q}" for d, (s, q) in sorted(state.items()))


def ordering_key(file: str, position: int) -> int:
    """The int64 that orders binlog positions of one server: file number, then byte."""
    match = _FILE_NUMBER.search(file)
    number = int(match.group(1)) if match else 0
    return number << 32 | position


class BinlogPosition(msgspec.Struct, frozen=True):
    """The next event to read: ``file``/``pos`` on the server, and ``gtids``, the GTID
    state after the last complete transaction before it ("" before the first)."""

    file: str
    pos: int
    gtids: str = ""

    @property
    def key(self) -> int:
        """The int64 ordering key (:func:`ordering_key`)."""
        return ordering_key(self.file, self.pos)

    def to_offset(self) -> dict[str, Any]:
        """The stored form (an offset value)."""
        return {"file": self.file, "pos": self.pos, "gtids": self.gtids}

    @classmethod
    def from_offset(cls, value: dict[str, Any]) -> BinlogPosition:
        """The position an offset value names; raises ConfigError when it is not one."""
        try:
            position = cls(str(value["file"]), int(value["pos"]), str(value.get("gtids", "")))
        except (KeyError, TypeError, ValueError):
            raise ConfigError("offset", f"stored offset {value!r} is not a MariaDB binlog "
                              "position (file, pos, gtids): was it written by another "
                              "source?") from None
        parse_gtid_state(position.gtids)
        return position

    def __str__(self) -> str:
        gtids = f" (GTID {self.gtids})" if self.gtids else ""
        return f"{self.file}:{self.pos}{gtids}"
