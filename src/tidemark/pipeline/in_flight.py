"""The micro-batches running on the driver, so a stop can wait until none does.

A batch runs in a thread py4j starts for Spark's ``foreachBatch`` callback, not in the
thread that runs the pipeline; delta-rs and pyarrow pull its rows through Python from
their own native threads. If the pipeline's thread returned (and the interpreter began
to shut down) while a batch ran, those threads would call into a finalizing interpreter:
``Fatal Python error: PyGILState_Release`` or a segmentation fault instead of a clean
exit. So the pipeline returns only once no batch is in flight.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class InFlight:
    """Counts the batches running now (entered from any thread)."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._running = 0

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Mark a batch as running for the ``with`` block."""
        with self._idle:
            self._running += 1
        try:
            yield
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    @property
    def running(self) -> int:
        """The batches running now."""
        return self._running

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no batch runs; False if one still does after *timeout_s*."""
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout_s)
