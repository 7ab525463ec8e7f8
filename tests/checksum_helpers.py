"""What the dialect tests compare with: a table's rows as the Delta target holds them,
put there by the real pipeline (``tidemark run``, available-now, in the tests' Spark
session), and the compared shape of that target."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from delta_rows import live_table
from tidemark.row_checksum import ComparedColumn, TableShape


def run_pipeline(spark: Any, dsn: str, table: str, where: Path, source_lines: str = "") -> Path:
    """Run ``tidemark run --available-now`` of *table* into a Delta table under *where*
    (again, on a second call: the checkpoint continues); the table's path."""
    from tidemark.pipeline import load_config  # noqa: PLC0415
    from tidemark.pipeline.runner import Pipeline  # noqa: PLC0415

    lake = where / "lake"
    where.mkdir(parents=True, exist_ok=True)
    file = where / "pipeline.toml"
    file.write_text(
        f'[source]\ndsn = "{dsn}"\n{source_lines}'
        f'[spark]\ncheckpoint = "{where}/chk"\navailable_now = true\n'
        'master = "local[1]"\nconf = { "spark.ui.enabled" = "false", '
        '"spark.sql.shuffle.partitions" = "1" }\n'
        f'[targets."{table}"]\npath = "{lake}"\nkeys = ["id"]\n')
    Pipeline(load_config(file), spark=spark).run()
    return lake


def target_rows(lake: Path, names: Sequence[str]) -> tuple[list[dict[str, Any]], TableShape]:
    """The Delta table's rows (Python values of its Arrow columns) in *names*, and the
    shape that compares those columns by their Delta types, keyed by ``id``."""
    table = live_table(DeltaTable(str(lake)))
    schema = pa.schema(DeltaTable(str(lake)).schema().to_arrow())
    shape = TableShape(tuple(ComparedColumn(n, schema.field(n).type) for n in names), ("id",))
    return table.select(list(names)).to_pylist(), shape
