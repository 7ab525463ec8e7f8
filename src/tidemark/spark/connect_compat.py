"""A fix pyspark 4.3's Spark Connect client lacks, for Spark Declarative Pipelines.

A pipeline run (``spark-pipelines run``) reads the server's events through
``SparkConnectClient.execute_command_as_iterator``, which in pyspark 4.3 fails on every
response that is not a command result: ``[UNKNOWN_RESPONSE] Unknown response: Plan
observed(__python_accumulator__=…)``. Python Data Source planner workers (tidemark's
source is one) always send their profiler accumulators, empty when profiling is off, and
the server forwards them as observed metrics among the run's events, so a run that read
from a Python data source ends with that error after its flows completed. Upstream
fixed it in SPARK-59135 (apache/spark#58435), after 4.3.0: the iterator passes such
responses on and the pipeline's consumer ignores them. :func:`patch_command_iterator`
does the client half of that, only where the client still has the bug.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)


def patch_command_iterator() -> bool:
    """Make ``execute_command_as_iterator`` skip observed and plan metrics instead of
    failing on them; returns whether the client needed it (and was patched)."""
    from pyspark.sql.connect.client.core import SparkConnectClient  # noqa: PLC0415

    original = SparkConnectClient.execute_command_as_iterator
    try:
        source = inspect.getsource(original)
    except (OSError, TypeError):  # no source to check: leave the client as it is
        return False
    if "UNKNOWN_RESPONSE" not in source or "_execute_and_fetch_as_iterator" not in source:
        return False

    def execute_command_as_iterator(self: Any, command: Any,
                                    observations: Any = None) -> Iterator[dict[str, Any]]:
        request = self._execute_plan_request_with_metadata()
        self._set_command_in_plan(request.plan, command)
        for response in self._execute_and_fetch_as_iterator(request, observations or {}):
            if isinstance(response, dict):
                yield response
            # Anything else is metrics that accompany the command's results
            # (observed metrics, plan metrics): nothing a command consumer reads.

    execute_command_as_iterator.__doc__ = original.__doc__
    SparkConnectClient.execute_command_as_iterator = execute_command_as_iterator  # type: ignore[method-assign]
    log.debug("patched SparkConnectClient.execute_command_as_iterator (SPARK-59135)")
    return True
