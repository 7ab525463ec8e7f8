"""What every source's engine task shares: reopening its connector after a retriable
failure, from the last committed offset.

A source's task says how to make and start its connector
(:meth:`ReopeningTask._new_connector`, :meth:`ReopeningTask._start_connector`);
this class keeps the offsets it was started with and the last one committed, and after a
:class:`~tidemark.errors.TransientError` from ``poll`` stops the broken connector and
opens a new one on the next poll (records after the committed offset are delivered
again: at-least-once).
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from typing import Generic, Protocol, TypeVar

from tidemark.errors import ConfigError, TransientError
from tidemark.offsets.store import Offset, OffsetReader
from tidemark.source.batch import SourceBatch

log = logging.getLogger(__name__)


class PollingConnector(Protocol):
    """The part of a source's connector the engine task drives."""

    @property
    def partition(self) -> str: ...

    def poll(self) -> SourceBatch: ...

    def commit(self, offset: Offset) -> None: ...

    def stop(self) -> None: ...


C = TypeVar("C", bound=PollingConnector)


class ReopeningTask(ABC, Generic[C]):
    """A :class:`~tidemark.source.spi.SourceTask` over one connector of type *C*."""

    def __init__(self) -> None:
        self._connector: C | None = None
        self._offsets: OffsetReader | None = None
        self._committed: Offset | None = None
        self._broken = False

    @abstractmethod
    def _new_connector(self) -> C:
        """A connector, not started yet."""

    @abstractmethod
    def _start_connector(self, connector: C, offset: Offset | None,
                         offsets: OffsetReader | None) -> None:
        """Start *connector* at *offset* (or where *offsets* says)."""

    @abstractmethod
    def _describe(self) -> str:
        """What the task captures, for logs (never a password)."""

    @property
    def partition(self) -> str:
        if self._connector is None:
            raise ConfigError("partition", "known only after start()")
        return self._connector.partition

    @property
    def connector(self) -> C | None:
        """The running capture (for tests and metrics)."""
        return self._connector

    def start(self, offsets: OffsetReader) -> None:
        self._offsets = offsets
        self._open(None)

    def _open(self, offset: Offset | None) -> None:
        connector = self._new_connector()
        # Held before it starts: stop() from another thread during a slow start (the
        # engine closing) must reach it.
        self._connector = connector
        self._start_connector(connector, offset, self._offsets)

    def poll(self) -> SourceBatch:
        if self._connector is None:
            raise ConfigError("poll", "start() the task first")
        if self._broken:
            self._reopen()
        try:
            return self._connector.poll()
        except TransientError:
            self._broken = True
            raise

    def _reopen(self) -> None:
        assert self._connector is not None
        with contextlib.suppress(Exception):
            self._connector.stop()
        resume = self._committed
        if resume is None and self._offsets is not None:
            with contextlib.suppress(Exception):
                resume = self._offsets.load(self._connector.partition)
        log.info("reconnecting capture of %s from %s", self._describe(),
                 resume or "its saved offset")
        self._open(resume)
        self._broken = False

    def commit(self, offset: Offset) -> None:
        self._committed = offset
        if self._connector is not None and not self._broken:
            self._connector.commit(offset)

    def stop(self) -> None:
        if self._connector is not None:
            self._connector.stop()
