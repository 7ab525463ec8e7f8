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


def test_sources_without_postgresql_do_not_import_psycopg() -> None:
    # psycopg takes about 0.1 s to load (several times that without cached bytecode):
    # the MariaDB and SQLite log-table sources, the engine, the offsets and the Spark
    # source's driver-side process (started anew at every query start) never use it.
    modules = ("tidemark.postgres_connection", "tidemark.source.postgres.config",
               "tidemark.source.mariadb.reader", "tidemark.source.logtable.reader",
               "tidemark.engine.engine", "tidemark.offsets.file", "tidemark.spark.source")
    code = (f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}]; "
            "print('psycopg' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


def test_the_connection_module_loads_psycopg_when_asked() -> None:
    # ServerTimeoutError is defined on first use; it is still the core module's name.
    code = ("import sys, tidemark.postgres_connection as pc; "
            "print('psycopg' in sys.modules, issubclass(pc.ServerTimeoutError, "
            "sys.modules['psycopg'].OperationalError), "
            "pc.parse_dsn('host=db dbname=app') == {'host': 'db', 'dbname': 'app'})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False True True"


def test_a_postgresql_capture_loads_only_what_it_uses() -> None:
    # Every module a capture start loads is paid for in its time to the first event:
    # incremental snapshots (a signal table) and the offsets file (--offsets) are
    # loaded when asked for.
    lazy = ("tidemark.source.postgres.incremental_snapshot", "tidemark.offsets.file")
    code = ("import sys, tidemark.cli.main, tidemark.cli.capture, "
            "tidemark.source.postgres.task, tidemark.source.postgres.reader; "
            f"print(','.join(m for m in {lazy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "", f"imported at capture start: {out}"
