"""The offset store interface."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeAlias

import msgspec

from tidemark.errors import ConfigError

#: A source position: a JSON-able mapping (PostgreSQL: ``{"lsn": …, "snapshot_completed": …}``).
Offset: TypeAlias = dict[str, Any]


def decode_json_object(data: bytes | str, what: str) -> dict[str, Any]:
    """Decode stored JSON that must be an object; *what* names it in the error."""
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError as err:
        raise ConfigError("offsets", f"{what} is not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise ConfigError("offsets", f"{what} is not a JSON object")
    return value


def show_json(value: Any, limit: int = 60) -> str:
    """*value* as JSON for an error message, cut to about *limit* characters."""
    try:
        text = msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError):
        text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}…"


class OffsetReader(Protocol):
    """Read access to saved offsets, by partition key."""

    def load(self, key: str) -> Offset | None:
        """The last saved offset of *key*, or None."""
        ...


def load_offsets(reader: OffsetReader, keys: Sequence[str]) -> dict[str, Offset]:
    """The saved offsets of *keys* (those that have one): one ``load_many`` where the
    store has it (one query for thousands of keys), else a ``load`` per key."""
    load_many = getattr(reader, "load_many", None)
    if callable(load_many):
        found: dict[str, Offset] = load_many(keys)
        return found
    out = {}
    for key in keys:
        offset = reader.load(key)
        if offset is not None:
            out[key] = offset
    return out


class OffsetStore(Protocol):
    """Keeps one offset per partition key (one per task or stream).

    Contract: :meth:`save` returns only once the offset is durable (a crash right after
    it must not lose it); :meth:`load` is a key lookup, never a scan of history.
    Implementations need not be thread-safe; one writer per key.
    """

    def load(self, key: str) -> Offset | None:
        """The last saved offset of *key*, or None."""
        ...

    def save(self, key: str, offset: Offset) -> None:
        """Durably replace the offset of *key*."""
        ...

    def load_many(self, keys: Sequence[str]) -> dict[str, Offset]:
        """The saved offsets of *keys* (absent keys left out), in one lookup."""
        ...

    def save_many(self, offsets: Mapping[str, Offset]) -> None:
        """Durably replace the offsets of several keys at once: all or none (a source
        with one offset per stream group saves thousands of keys; one write, not one
        per key)."""
        ...


def connect_store(store: object) -> None:
    """Open *store*'s connection now if it has one (a ``connect`` method): a store that
    connects lazily otherwise reports a configuration error (a missing schema, a
    foreign table) only at its first save, after records were delivered. Raises what
    ``connect`` raises (:class:`~tidemark.errors.SourceUnavailableError` for a server
    that cannot be reached)."""
    connect = getattr(store, "connect", None)
    if callable(connect):
        connect()
