"""Waiting for a condition with a deadline (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str,
             interval_s: float = 0.05) -> Any:
    """*predicate*'s first truthy value, polled every *interval_s*; an AssertionError
    naming *what* after *timeout_s*."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
