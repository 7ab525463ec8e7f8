"""Verify's test helpers: a pipeline file and a pipeline run into Delta."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from tidemark.pipeline import load_config
from tidemark.pipeline.runner import Pipeline

SPARK = ('master = "local[1]"\navailable_now = true\n'
         'conf = { "spark.ui.enabled" = "false", "spark.sql.shuffle.partitions" = "1" }')


def pipeline_file(tmp_path: Path, dsn: str, name: str, targets: str, *,
                  signal: str = "") -> Path:
    """A pipeline.toml of *targets* (TOML of ``[targets."..."]`` sections)."""
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{dsn}"\nslot = "s_{name}"\n'
                    f'publication = "p_{name}"\n{signal}[spark]\ncheckpoint = "chk"\n'
                    f"{SPARK}\n{targets}")
    return file


def run_pipeline(spark: SparkSession, file: Path) -> None:
    """Run the pipeline until it has caught up (available-now)."""
    Pipeline(load_config(file), spark=spark).run()
