"""Offset stores: where a capture remembers how far it has durably delivered."""

from tidemark.offsets.store import Offset, OffsetStore

__all__ = ["Offset", "OffsetStore"]
