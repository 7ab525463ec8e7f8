"""A running snapshot as the Spark source's offset carries it (pure data: ``tidemark
status`` reads it without Spark). The algorithm is in
:mod:`tidemark.source.postgres.chunked_snapshot`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tidemark.source.postgres.pgoutput import lsn_to_str, str_to_lsn

KeyText = tuple[str, ...]
"""A primary key's values as the text their output functions print."""



@dataclasses.dataclass(frozen=True)
class ChunkRange:
    """The rows of *table* with ``after < key <= upto`` (key text; None: unbounded)."""

    table: str
    after: KeyText | None
    upto: KeyText | None

    def to_json(self) -> list[Any]:
        return [self.table, _key_json(self.after), _key_json(self.upto)]

    @classmethod
    def from_json(cls, raw: Sequence[Any]) -> ChunkRange:
        table, after, upto = raw
        return cls(str(table), _key_from(after), _key_from(upto))


@dataclasses.dataclass(frozen=True)
class SnapshotPlan:
    """A running snapshot, as the source's offset carries it.

    ``tables[position]`` is read next, from the key after ``after`` (None: its first
    chunk); ``position == len(tables)`` once every chunk is planned. ``chunks`` are the
    chunks of the batch that ends at this offset.
    """

    generation: int
    at: int
    """The consistent point ``C`` of this generation's export."""
    export: str
    """The exported snapshot's name (valid while the driver that made it lives)."""
    taken_us: int
    """When the export was made (µs since the epoch): the snapshot rows' commit time."""
    tables: tuple[str, ...]
    position: int = 0
    after: KeyText | None = None
    chunks: tuple[ChunkRange, ...] = ()
    chunks_done: int = 0
    """Chunks planned so far, this offset's included."""
    estimates: tuple[int, ...] = ()
    """Each table's row count as the planner estimates it, for progress lines."""

    @property
    def done(self) -> bool:
        """Every chunk is planned (the last ones are in this offset's batch)."""
        return self.position >= len(self.tables)

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "at": lsn_to_str(self.at),
                "export": self.export, "taken_us": self.taken_us,
                "tables": list(self.tables), "position": self.position,
                "after": _key_json(self.after), "chunks": [c.to_json() for c in self.chunks],
                "chunks_done": self.chunks_done, "estimates": list(self.estimates)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SnapshotPlan:
        return cls(generation=int(raw["generation"]), at=str_to_lsn(str(raw["at"])),
                   export=str(raw["export"]), taken_us=int(raw["taken_us"]),
                   tables=tuple(str(t) for t in raw["tables"]),
                   position=int(raw["position"]), after=_key_from(raw.get("after")),
                   chunks=tuple(ChunkRange.from_json(c) for c in raw.get("chunks", ())),
                   chunks_done=int(raw.get("chunks_done", 0)),
                   estimates=tuple(int(n) for n in raw.get("estimates", ())))

    def progress(self, chunk_rows: int) -> str:
        """``table: chunk n/~total`` of the table being read, for progress lines."""
        if self.done:
            return f"snapshot of {', '.join(self.tables)} read ({self.chunks_done} chunks)"
        table = self.tables[self.position]
        total = sum(max(1, -(-n // chunk_rows)) for n in self.estimates) \
            if self.estimates else 0
        return (f"snapshot {table}: chunk {self.chunks_done}/~{total} "
                f"(table {self.position + 1} of {len(self.tables)})")


def _key_json(key: KeyText | None) -> list[str] | None:
    return None if key is None else list(key)


def _key_from(raw: Any) -> KeyText | None:
    return None if raw is None else tuple(str(v) for v in raw)
