"""A worker thread running one consumer's items in order (:class:`Lane`)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from tidemark.engine.flow_control import FailureHolder

# A lane whose last item took less than this runs the next one in the reader's thread
# while it is idle (see Lane): one thread hand-off costs about as much.
_HERE_MAX_S = 0.002


class Lane:
    """A worker thread that runs items of one queue in order.

    An item may also run in the caller's thread (:meth:`run_here`) while the lane has
    nothing queued or running, so the order stays the same: for work that returns
    quickly, handing it to another thread costs more than the work, as both threads
    then trade the GIL on every item.
    """

    _STOP = object()

    def __init__(self, name: str, run: Callable[[Any], None], failure: FailureHolder) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._run = run
        self._failure = failure
        self._stopping = False
        # Items put (counted by the one thread that puts) and finished by the lane
        # (counted by the lane): equal when the lane is idle.
        self._put = 0
        self._done = 0
        self.last_run_s = float("inf")  # how long the last item took
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def put(self, item: Any) -> None:
        self._put += 1
        self._queue.put(item)

    def runs_here(self) -> bool:
        """Whether the next item should run in the caller's thread: the lane is idle
        and its last item took less than _HERE_MAX_S (the first always goes to the
        lane, so that a consumer that blocks does not block the caller)."""
        return self._put == self._done and self.last_run_s < _HERE_MAX_S

    def run_here(self, item: Any) -> None:
        """Run *item* in the calling thread (errors propagate to the caller)."""
        started = time.perf_counter()
        self._run(item)
        self.last_run_s = time.perf_counter() - started

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is self._STOP or self._stopping:
                return
            try:
                self.run_here(item)
            except BaseException as err:
                self._failure.set(err)
                return
            self._done += 1

    def stop(self, discard: bool) -> None:
        """Finish queued items (or, with *discard*, only the one in hand), then end."""
        self._stopping = discard
        self._queue.put(self._STOP)
