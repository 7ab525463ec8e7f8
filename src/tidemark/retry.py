"""Retrying transient failures with exponential backoff: one loop for every caller."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from tidemark.errors import TransientError

_T = TypeVar("_T")


def retry_transient(action: Callable[[], _T], *, max_retries: int, initial_delay_s: float,
                    max_delay_s: float,
                    on_retry: Callable[[TransientError, int, float], None],
                    sleep: Callable[[float], None] = time.sleep) -> _T:
    """Run *action*; on :class:`TransientError` call ``on_retry(error, attempt, delay)``,
    ``sleep(delay)`` and try again, the delay doubling up to *max_delay_s*. After
    *max_retries* retries (a negative number: no limit) the error is raised. *sleep* may
    raise to abandon the retries (a stop request)."""
    delay = initial_delay_s
    attempt = 0
    while True:
        try:
            return action()
        except TransientError as err:
            attempt += 1
            if 0 <= max_retries < attempt:
                raise
            on_retry(err, attempt, delay)
            sleep(delay)
            delay = min(delay * 2, max_delay_s)
