"""Two offset stores with a defined precedence: a local one and a remote one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType

from tidemark.offsets.store import Offset, OffsetStore, connect_store, load_offsets


class LayeredOffsetStore:
    """Offsets kept in a *local* store and a *remote* store.

    Precedence:

    * :meth:`load` reads *local* first. Only when *local* has no offset for the key does
      it read *remote*; a value found there is saved to *local* (so the next load is
      local) and returned.
    * :meth:`save` writes *local*, then *remote*; it returns only when both are durable.

    Why: the local store (a file or SQLite on this machine) is fast, and it is
    authoritative for this process, because this process is the only writer of its keys
    and saves there first, so local is never behind remote. The remote store (a
    PostgreSQL table) survives the loss of the machine: a capture restarted on a fresh
    machine, whose local store is empty, resumes from the remote copy.

    Durability: when :meth:`save` returns, the offset is durable in both stores (each
    store's own contract). If the remote write fails the error propagates and the local
    store is one save ahead of the remote; that is safe because local wins on load, and
    the next successful save brings the remote up to date. A save never counts on the
    local store alone: the engine retries a save whose remote is unreachable and confirms
    nothing to the source meanwhile, since a remote left behind while the source
    released its changes could not resume a capture on another machine. A local store restored from
    an old backup would win over a newer remote; delete it to resume from the remote.
    """

    def __init__(self, local: OffsetStore, remote: OffsetStore) -> None:
        self.local = local
        self.remote = remote

    def __str__(self) -> str:
        return f"{self.local} (over {self.remote})"

    def load(self, key: str) -> Offset | None:
        """The local offset of *key*; else the remote one, copied to local; else None."""
        offset = self.local.load(key)
        if offset is not None:
            return offset
        offset = self.remote.load(key)
        if offset is not None:
            self.local.save(key, offset)
        return offset

    def save(self, key: str, offset: Offset) -> None:
        """Durably save *offset* locally, then remotely."""
        self.local.save(key, offset)
        self.remote.save(key, offset)

    def load_many(self, keys: Sequence[str]) -> dict[str, Offset]:
        """Local offsets of *keys*; the others from remote, copied to local."""
        found = load_offsets(self.local, keys)
        missing = [k for k in keys if k not in found]
        if missing:
            remote = load_offsets(self.remote, missing)
            if remote:
                self.local.save_many(remote)
                found.update(remote)
        return found

    def save_many(self, offsets: Mapping[str, Offset]) -> None:
        """Durably save *offsets* locally, then remotely."""
        self.local.save_many(offsets)
        self.remote.save_many(offsets)

    def connect(self) -> None:
        """Connect both stores now (those that have a ``connect``), local first: the
        engine calls this at start so that a misconfigured remote (a missing schema, a
        foreign table) is found before anything is delivered, not at the first save
        (its loads are served by the local store)."""
        connect_store(self.local)
        connect_store(self.remote)

    def close(self) -> None:
        """Close both stores (those that have a ``close``), remote last."""
        try:
            _close(self.local)
        finally:
            _close(self.remote)

    def __enter__(self) -> LayeredOffsetStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _close(store: OffsetStore) -> None:
    close = getattr(store, "close", None)
    if callable(close):
        close()
