"""A ``tidemark-repair`` on PostgreSQL read at exactly its batch's end.

The keys' rows must be the state every change of the batch leaves and none after: a
row read "now" on the executor may hold a transaction committed after the batch's end
(an SCD2 version starting too early, then repeated by the stream), or miss one the
batch holds (decoded before other sessions see it, as with synchronous replication),
and overwrite it with an older row at a higher sequence. So the repair is held like a
one-chunk snapshot generation (:mod:`tidemark.source.postgres.chunked_snapshot`): the
driver exports a snapshot from a temporary slot, whose consistent point ``C`` it sees
exactly (every transaction committing before ``C``, none at or after it); the stream's
batches end at ``C`` at the latest while the repair waits (:class:`RepairHold` in the
offset), and the batch that ends at ``C`` takes it: its executor imports the export
and reads the keys' rows under it, stamped at ``C - 1`` (above every commit of the
batch, below every later one).

The export dies with the driver: a batch replayed by a new driver, or a held repair
found by one, takes a new export and waits for its new ``C`` (a repair applied twice
is idempotent; one applied at a later position is still exact there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tidemark.source.postgres.pgoutput import lsn_to_str, str_to_lsn
from tidemark.source.repair import RepairRead, RepairRequest, requests_from, requests_json


@dataclasses.dataclass(frozen=True)
class RepairHold:
    """Repairs waiting for (or taken by) the batch ending at *at*, the consistent point
    of the exported snapshot *export* they are read under."""

    at: int
    export: str
    requests: tuple[RepairRequest, ...]

    def to_json(self) -> dict[str, Any]:
        return {"at": lsn_to_str(self.at), "export": self.export,
                "requests": requests_json(self.requests)}

    @classmethod
    def from_json(cls, value: Mapping[str, Any] | None) -> RepairHold | None:
        if value is None:
            return None
        return cls(str_to_lsn(str(value["at"])), str(value["export"]),
                   requests_from(value["requests"]))


class ExportedRepairRead(RepairRead):
    """A repair partition read under the exported snapshot *export*."""

    def __init__(self, index: int, requests: Sequence[RepairRequest], commit_lsn: int,
                 export: str) -> None:
        super().__init__(index, requests, commit_lsn)
        self.export = export
