"""Start the executors' Python workers, with tidemark imported, while a query starts.

Without this, a query's first batch waits on every executor for Spark to start its
Python worker daemon, fork the workers, and for each worker to import pyspark and
tidemark. pyspark's modules come from ``pyspark.zip`` on the workers' path, which Python
cannot cache bytecode for, so every new process compiles them again. Measured on the
2-core machine at ``local[2]``: 1.8 s of the first batch's 4.8 s of reading went to
this, before the first change was read (``docs/benchmarks.md``).

Spark keeps idle Python workers and gives them to later tasks of any job, data source
reads included (``spark.python.worker.reuse``, on by default; idle workers live for a
minute). So one small job, one task per core, whose tasks import the modules the query's
tasks will use leaves warm workers behind. It runs in a thread while the query starts:
Spark's own start of a query (the source's planner processes, the first offsets) takes
seconds of its own, and the first batch's tasks queue behind the warm-up's tasks on the
same cores rather than starting their own workers.

A failed warm-up is only logged: the query's tasks then start their workers as usual.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def _importer(modules: Sequence[str]
              ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each warm-up task runs on its executor."""

    def warm(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for name in modules:
            importlib.import_module(name)
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"id": batch.column(0)})

    return warm


def warm_python_workers(spark: SparkSession, modules: Sequence[str]) -> threading.Thread | None:
    """Start one task per core of the session's executors that imports *modules*, in a
    daemon thread (returned, already started); None when Spark does not reuse Python
    workers, so warming them would be wasted."""
    reuse = spark.conf.get("spark.python.worker.reuse", "true")
    if str(reuse).lower() != "true":
        log.debug("spark.python.worker.reuse is off: Python workers are not warmed")
        return None
    tasks = max(1, spark.sparkContext.defaultParallelism)
    thread = threading.Thread(target=_warm, args=(spark, tuple(modules), tasks),
                              name="tidemark-warm-workers", daemon=True)
    thread.start()
    return thread


def _warm(spark: SparkSession, modules: tuple[str, ...], tasks: int) -> None:
    started = time.monotonic()
    try:
        spark.sparkContext.setLocalProperty("spark.job.description",
                                            "tidemark: start Python workers")
        (spark.range(0, tasks, 1, tasks)
         .mapInArrow(_importer(modules), "id long")
         .collect())
    except Exception as err:  # a warm-up must never fail the pipeline
        log.debug("warming the executors' Python workers failed: %s", err)
        return
    log.debug("%d Python worker(s) started with %s imported in %.2f s", tasks,
              ", ".join(modules), time.monotonic() - started)
