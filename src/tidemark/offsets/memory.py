"""An in-memory offset store, for tests and for captures that need no resume."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

from tidemark.offsets.store import Offset


class MemoryOffsetStore:
    """Offsets in a dict; lost when the process ends. Loads and saves copy, so a caller
    changing an offset it holds never changes the stored one."""

    def __init__(self) -> None:
        self.offsets: dict[str, Offset] = {}

    def __str__(self) -> str:
        return "in-memory offsets"

    def load(self, key: str) -> Offset | None:
        offset = self.offsets.get(key)
        return copy.deepcopy(offset) if offset is not None else None

    def save(self, key: str, offset: Offset) -> None:
        self.offsets[key] = copy.deepcopy(offset)

    def load_many(self, keys: Sequence[str]) -> dict[str, Offset]:
        return {k: copy.deepcopy(self.offsets[k]) for k in keys if k in self.offsets}

    def save_many(self, offsets: Mapping[str, Offset]) -> None:
        self.offsets.update(copy.deepcopy(dict(offsets)))
