"""``tidemark pipelines``: Spark Declarative Pipelines' ``spark-pipelines`` with tidemark.

The same commands and options as ``spark-pipelines`` (``run``, ``dry-run``, ``init``,
``--spec``, ``--full-refresh`` …), launched the way that script launches them (Spark's
``SparkPipelines`` class, which starts a local Spark Connect server), with two
differences: Spark's Python workers use this interpreter (so they import tidemark), and
the client carries the fix a run that reads ``format("tidemark")`` needs on pyspark 4.3
(:mod:`tidemark.spark.connect_compat`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import click

from tidemark.errors import ConfigError


@click.command(context_settings={"ignore_unknown_options": True,
                                 "allow_extra_args": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def pipelines(args: tuple[str, ...]) -> None:
    """Run a Spark Declarative Pipeline (``spark-pipelines`` arguments: ``run``,
    ``dry-run``, ``init --name N``, ``--spec FILE``, ``--help``)."""
    missing = [name for name in ("grpc", "yaml") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError("pipelines", f"needs Spark Connect's client and PyYAML (missing: "
                                       f"{', '.join(missing)}); install tidemark[pipelines]")
    import pyspark  # noqa: PLC0415

    import tidemark.spark.pipelines_cli as entry  # noqa: PLC0415

    spark_home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    python = Path(spark_home) / "python"
    py4j = sorted((python / "lib").glob("py4j-*-src.zip"))
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env["SPARK_HOME"] = spark_home
    env["PYTHONPATH"] = os.pathsep.join(
        [*(str(p) for p in py4j), str(python), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    spark_class = str(Path(spark_home) / "bin" / "spark-class")
    os.execve(spark_class, [spark_class, "org.apache.spark.deploy.SparkPipelines",
                            str(entry.__file__), *args], env)
