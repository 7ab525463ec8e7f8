"""Warming the executors' Python workers: the next job's tasks run in workers that
already imported what the warm-up imported.

A session of its own (in a child process), so that its pool of idle Python workers
holds only what this test put there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

_SCRIPT = textwrap.dedent("""
    import json, sys
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from tidemark.spark.worker_warmup import warm_python_workers

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .getOrCreate())

    def imported(name):
        def check(batches):
            for batch in batches:
                yield pa.RecordBatch.from_pydict({"found": [name in sys.modules]
                                                  * batch.num_rows})
        return [r.found for r in spark.range(0, 2, 1, 2)
                .mapInArrow(check, "found boolean").collect()]

    before = imported("colorsys")
    thread = warm_python_workers(spark, ["colorsys"])
    thread.join(timeout=120)
    print(json.dumps({"before": before, "joined": not thread.is_alive(),
                      "after": imported("colorsys")}))
    spark.stop()
""")


def test_the_next_jobs_tasks_run_in_the_warmed_workers() -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # colorsys is imported by nothing but the warm-up: before it, no worker has it.
    assert result == {"before": [False, False], "joined": True, "after": [True, True]}
