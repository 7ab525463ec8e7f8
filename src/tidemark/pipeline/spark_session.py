"""The SparkSession ``tidemark run`` starts, with the settings its batches need."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator

from pyspark.sql import SparkSession

from tidemark.pipeline.config import PipelineConfig

log = logging.getLogger(__name__)


def build_session(config: PipelineConfig) -> SparkSession:
    """The SparkSession of ``[spark]`` (or the one already running in this process)."""
    # Spark's Python workers must import this tidemark (local mode).
    # pyspark 4.3 warns about pandas 3 on every mapInArrow; tidemark's Arrow path does
    # not use pandas, so the warning would only clutter the progress lines.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(config.spark.master)
               .appName(config.spark.app_name)
               # The console progress bar would garble the per-batch lines.
               .config("spark.ui.showConsoleProgress", "false")
               # An arrow envelope row holds thousands of change rows: Spark's Arrow
               # batches for the executors' apply are cut by bytes, not only by rows.
               .config("spark.sql.execution.arrow.maxBytesPerBatch", str(64 << 20))
               # A collected batch's task results (its Arrow rows, up to collect_max_mb)
               # go to the driver with the task's status, not through the block
               # manager and a second fetch (Spark's default for that is 1 MiB); Spark
               # caps it at spark.rpc.message.maxSize.
               .config("spark.task.maxDirectResultSize", str(64 << 20)))
    for key, value in config.spark.conf.items():
        builder = builder.config(key, value)
    with _sigint_kept():
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    _quiet_query_failures(session)
    return session


@contextlib.contextmanager
def _sigint_kept() -> Iterator[None]:
    """Put back the SIGINT handler a new SparkContext replaces.

    pyspark's handler cancels every job and raises KeyboardInterrupt in the main thread,
    which ends the process while a batch may still be running in py4j's callback thread
    (see :mod:`tidemark.pipeline.in_flight`); ``tidemark run``'s own handler stops the
    query after the batch in progress instead.
    """
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)


def _quiet_query_failures(session: SparkSession) -> None:
    """Spark logs a failed query's whole trace (JVM and Python, ~50 lines) at ERROR;
    the pipeline reports the failure itself in one line, and retries it when
    PostgreSQL was only unreachable, so that log would only bury the message."""
    try:
        jvm = session.sparkContext._jvm
        assert jvm is not None
        # Only the class that logs a query's end: the package's warnings stay.
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
            jvm.org.apache.logging.log4j.Level.OFF)
    except Exception as err:  # only logging: never fail the pipeline for it
        log.debug("could not quiet Spark's query-failure log: %s", err)
