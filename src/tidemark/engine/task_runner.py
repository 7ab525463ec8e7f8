"""One task's worker: start it, poll it, hand batches on, save and commit offsets.

Offsets are saved to the store first and then confirmed to the task (for PostgreSQL:
the slot is told it may release WAL), so that a crash between the two only repeats
records, never loses them. Retriable errors (:class:`TransientError`) of start, poll,
offset save and commit are retried in place with exponential backoff, up to
``errors_max_retries``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from tidemark.engine.config import EngineConfig
from tidemark.engine.delivery import Delivery
from tidemark.engine.flow_control import CancelledError, Capacity, FailureHolder
from tidemark.engine.offset_tracker import OffsetTracker
from tidemark.errors import TransientError
from tidemark.offsets.store import Offset, OffsetReader, OffsetStore
from tidemark.retry import retry_transient
from tidemark.source.spi import SourceTask, save_offset

log = logging.getLogger(__name__)
_T = TypeVar("_T")
_IDLE_WAIT_S = 0.05


class TaskRunner:
    """Runs one :class:`SourceTask` in the engine (its ``run`` is the task's worker)."""

    def __init__(self, index: int, task: SourceTask, config: EngineConfig,
                 store: OffsetStore, store_lock: threading.Lock,
                 make_delivery: Callable[[OffsetTracker[Offset], Capacity, FailureHolder],
                                         Delivery]) -> None:
        self.index = index
        self.task = task
        self.config = config
        self._store = store
        self._store_lock = store_lock
        self.stopping = threading.Event()
        self.failure = FailureHolder()
        self.tracker: OffsetTracker[Offset] = OffsetTracker()
        # Saving after every batch (offset_flush_interval_ms = 0), records count as in
        # flight until saved: a crash then redelivers at most max_in_flight records.
        self.capacity = Capacity(config.max_in_flight, self._cancelled, self.flush,
                                 until_saved=config.offset_flush_interval_ms == 0)
        self.delivery = make_delivery(self.tracker, self.capacity, self.failure)
        self.finished = False
        self.started = False
        self.thread: threading.Thread | None = None  # the poll loop's worker
        self._last_flush = float("-inf")  # the first offset is saved at once
        self._committed: Offset | None = None
        self._exit_lock = threading.Lock()
        self._exited = False
        self._abandoned = False

    def _cancelled(self) -> bool:
        return self.stopping.is_set() or self.failure.error is not None

    # -- retries ---------------------------------------------------------------------
    def retrying(self, action: Callable[[], _T], what: str) -> _T:
        """Run *action*, retrying TransientError with backoff (stops early on stop)."""
        cfg = self.config
        limit = "∞" if cfg.errors_max_retries < 0 else str(cfg.errors_max_retries)

        def log_retry(err: TransientError, attempt: int, delay: float) -> None:
            log.warning("task %d: %s failed (%s); retry %d/%s in %.1fs", self.index, what,
                        err, attempt, limit, delay)

        def sleep_unless_stopping(delay: float) -> None:
            if self.stopping.wait(delay):
                raise CancelledError

        return retry_transient(action, max_retries=cfg.errors_max_retries,
                               initial_delay_s=cfg.errors_retry_delay_initial_ms / 1000,
                               max_delay_s=cfg.errors_retry_delay_max_ms / 1000,
                               on_retry=log_retry, sleep=sleep_unless_stopping)

    # -- lifecycle -------------------------------------------------------------------
    def start(self, offsets: OffsetReader) -> None:
        self.retrying(lambda: self.task.start(offsets), "start")
        self.started = True

    def run(self) -> None:
        """Poll until finished, stopped or failed; errors end up in ``failure``."""
        try:
            self._poll_loop()
        except CancelledError:
            pass
        except BaseException as err:
            self.failure.set(err)
        finally:
            with self._exit_lock:
                self._exited = True
                abandoned = self._abandoned
            if abandoned:
                self._stop_late()

    def abandon(self) -> bool:
        """The engine stops waiting for this runner's thread (stuck in a poll, or in a
        consumer called in it): the thread stops the task itself when it gets out, so
        its connection does not outlive the engine. False if the thread has ended
        meanwhile (the caller then stops the task as usual)."""
        with self._exit_lock:
            if self._exited:
                return False
            self._abandoned = True
            return True

    def _stop_late(self) -> None:
        log.warning("task %d: its thread came back after the engine stopped; stopping the "
                    "task now", self.index)
        self.delivery.close(discard=True)
        try:
            self.task.stop()
        except Exception as err:
            log.warning("task %d did not stop cleanly: %s", self.index, err)

    def _poll_loop(self) -> None:
        task = self.task
        delivery = self.delivery
        while not self.stopping.is_set():
            self.failure.raise_if_failed()
            batch = self.retrying(task.poll, "poll")
            if self.stopping.is_set():
                # close() was called while the poll ran: no consumer call may start
                # after it (nor after STOPPED, if the engine gave up waiting). The
                # batch's offset is not saved: it comes again after a restart.
                return
            if batch.records or batch.lines or batch.offset is not None:
                delivery.dispatch(batch.records, batch.offset, batch.lines)
            self.flush()
            if batch.finished:
                self._finish()
                return
            if not batch.records and not batch.lines:
                self.stopping.wait(_IDLE_WAIT_S)

    def _finish(self) -> None:
        """The source has nothing more: wait for the consumers, save the last offset."""
        while not self.capacity.wait_empty(_IDLE_WAIT_S, self._cancelled):
            self.failure.raise_if_failed()
            if self.stopping.is_set():
                return
            self.flush()
        self.failure.raise_if_failed()
        self.flush(force=True)
        self.finished = True

    def flush(self, force: bool = False) -> None:
        """Save and commit the committable offset if the flush interval has passed."""
        now = time.monotonic()
        if not force and now - self._last_flush < self.config.offset_flush_interval_ms / 1000:
            return
        capacity = self.capacity
        # Read before taking the offset: these records are all behind it.
        unsaved = capacity.unsaved if capacity.until_saved else 0
        offset = self.tracker.take_committable()
        if offset is None:
            # Records passed with no offset of their own (or saved with the last one
            # taken): there is nothing to save for them.
            if unsaved:
                capacity.release_saved(unsaved)
            # Only a save starts the interval: polls with nothing to save (a stream
            # opening) must not hold back the first offset that comes after them.
            return
        self._last_flush = now

        def save() -> None:
            with self._store_lock:  # not held while waiting to retry
                save_offset(self._store, self.task, offset)

        # A store that is briefly unreachable (a remote offsets table) must not end the
        # engine: the save is retried like a commit, and the offset is confirmed to the
        # source only once saved, so nothing the store lacks is released.
        try:
            self.retrying(save, "offset save")
        except BaseException:
            # Cancelled by a stop (or failed for good): the offset is still to be saved,
            # by the final flush if the store is back by then, and the records behind
            # it stay counted until it is.
            self.tracker.put_back(offset)
            raise
        if unsaved:
            capacity.release_saved(unsaved)
        self._committed = offset
        self.retrying(lambda: self.task.commit(offset), "commit")

    def drain(self, timeout_s: float) -> None:
        """After a stop request: let in-flight records finish for up to *timeout_s*,
        save what is committable, end the workers."""
        drained = timeout_s > 0 and self.capacity.wait_empty(
            timeout_s, lambda: self.failure.error is not None)
        if not drained and self.capacity.in_flight:
            log.info("task %d: stopping with %d records in flight; they will be delivered "
                     "again after a restart", self.index, self.capacity.in_flight)
        try:
            self.flush(force=True)
        except Exception as err:  # the task may be broken; the saved offset stays
            log.warning("task %d: could not commit the last offset: %s", self.index, err)
        self.delivery.close(discard=not drained)
