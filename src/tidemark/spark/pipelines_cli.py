"""The Spark Declarative Pipelines CLI with :mod:`tidemark.spark.connect_compat`'s fix:
the program ``tidemark pipelines`` hands to Spark's ``SparkPipelines`` launcher in
place of pyspark's own ``pipelines/cli.py`` (same arguments: ``run``, ``dry-run``,
``init``)."""

from __future__ import annotations


def main() -> None:
    """Patch the Connect client where needed, then run pyspark's pipelines CLI."""
    from tidemark.spark.connect_compat import patch_command_iterator  # noqa: PLC0415

    patch_command_iterator()
    from pyspark.pipelines.cli import main as pipelines_main  # noqa: PLC0415

    pipelines_main()


if __name__ == "__main__":
    main()
