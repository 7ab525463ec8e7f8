"""A change sink for read-plan tests of ``tidemark-repair``: the rows a partition adds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidemark.event import WireTuple


class RowsSink:
    """The rows a partition adds (op, values, position, sequence)."""

    def __init__(self, columns: Sequence[str]) -> None:
        self._columns = list(columns)
        self.added: list[tuple[str, WireTuple | None, int, int]] = []

    def relation(self, rel: Any, at: int = 0) -> None:
        pass

    def rows(self, relation_id: int, block: Any) -> None:
        raise AssertionError("a repair adds rows one by one")

    def add(self, relation_id: int, op: str, values: WireTuple | None, lsn: int, seq: int,
            txn: Any, may_have_toast: bool, old: WireTuple | None) -> None:
        self.added.append((op, values, lsn, seq))

    def snapshot(self, *args: Any) -> None:
        raise AssertionError("no snapshot here")

    def columns(self, table: str) -> list[str]:
        return self._columns
