"""What the reader and the consumers' threads of one task share to pace and stop each
other: :class:`Capacity` bounds the records in flight (backpressure), a
:class:`FailureHolder` keeps the first error of any worker, and :class:`CancelledError`
ends a wait when the task stops or fails."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

_WAIT_SLICE_S = 0.1


class CancelledError(Exception):
    """Waiting was abandoned because the task is stopping or has failed."""


class FailureHolder:
    """The first error raised by any worker of a task."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self.changed = threading.Event()

    def set(self, error: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
        self.changed.set()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error


class Capacity:
    """Counts records in flight and makes the reader wait above the limit.

    A record counts from when it is handed on until the committable offset passes it
    (:meth:`release`), or, with *until_saved*, until that offset is saved
    (:meth:`passed`, then :meth:`release_saved` after the save): then what a crash
    redelivers never exceeds the limit, as nothing processed and unsaved is uncounted.
    """

    def __init__(self, limit: int, cancelled: Callable[[], bool],
                 while_waiting: Callable[[], None] = lambda: None, *,
                 until_saved: bool = False) -> None:
        self.limit = limit
        self.until_saved = until_saved
        self._in_flight = 0
        self._unsaved = 0  # until_saved: passed by the committable offset, not saved yet
        self._wanted = 0  # what a waiting acquire needs to fit
        self._changed = threading.Condition()
        self._cancelled = cancelled
        # Called between waits (outside the lock): the reader saves offsets meanwhile,
        # so that a long wait for a slow consumer does not hold back the saved offset.
        self._while_waiting = while_waiting

    @property
    def in_flight(self) -> int:
        with self._changed:
            return self._in_flight

    def acquire(self, n: int) -> None:
        """Wait until *n* more records fit (a batch larger than the limit is let in
        alone, so that it cannot wait forever)."""
        while True:
            with self._changed:
                if not self._in_flight or self._in_flight + n <= self.limit:
                    self._in_flight += n
                    self._wanted = 0
                    return
                if self._cancelled():
                    raise CancelledError
                self._wanted = n
                self._changed.wait(_WAIT_SLICE_S)
            self._while_waiting()

    def release(self, n: int) -> None:
        with self._changed:
            self._in_flight -= n
            # Wake the reader once what it waits for fits (or nothing is in flight, for
            # wait_empty), not at every completion: each wake-up takes the GIL from
            # the consumers' threads.
            if not self._in_flight or self._in_flight + self._wanted <= self.limit:
                self._changed.notify_all()

    def passed(self, n: int) -> None:
        """(*until_saved*) The committable offset passed *n* more records: they stay
        counted until the reader has saved it; a reader waiting for room is woken to
        save it (and waiters for an empty pipeline, as nothing is left to process)."""
        with self._changed:
            self._unsaved += n
            if self._wanted or self._in_flight == self._unsaved:
                self._changed.notify_all()

    @property
    def unsaved(self) -> int:
        """(*until_saved*) Records passed by the committable offset, not yet saved."""
        with self._changed:
            return self._unsaved

    def release_saved(self, n: int) -> None:
        """(*until_saved*) *n* of the unsaved records (read before taking the offset
        that was then saved) are saved: they stop counting."""
        with self._changed:
            self._unsaved -= n
        self.release(n)

    def wait_empty(self, timeout_s: float | None, stop_early: Callable[[], bool]) -> bool:
        """Wait until nothing is left to process (in flight, or unsaved only); False on
        timeout or when *stop_early*."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            while self._in_flight > self._unsaved:
                if stop_early():
                    return False
                remaining = _WAIT_SLICE_S if deadline is None else min(
                    _WAIT_SLICE_S, deadline - time.monotonic())
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True
