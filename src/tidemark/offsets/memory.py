"""An in-memory offset store, for tests and for captures that need no resume."""

from __future__ import annotations

from tidemark.offsets.store import Offset


class MemoryOffsetStore:
    """Offsets in a dict; lost when the process ends."""

    def __init__(self) -> None:
        self.offsets: dict[str, Offset] = {}

    def load(self, key: str) -> Offset | None:
        return self.offsets.get(key)

    def save(self, key: str, offset: Offset) -> None:
        self.offsets[key] = dict(offset)
