"""The command line must start fast: loading it (as `tidemark capture` does) must not
import the heavy libraries that only the pipeline and the Arrow converter need."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pyarrow", "pyspark", "deltalake", "pandas", "fastavro")


def test_loading_the_cli_imports_no_heavy_library() -> None:
    code = ("import sys, tidemark.cli.main, tidemark.engine.engine; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "", f"imported at CLI start: {out}"


def test_loading_the_spark_source_does_not_import_pandas() -> None:
    # Spark starts a fresh Python process for the source's driver-side methods at every
    # query start; pandas (0.3 s) would be loaded there for nothing.
    code = ("import sys, tidemark.spark.source; "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
