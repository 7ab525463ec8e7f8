"""The public surface: what ``from tidemark import …`` offers is pinned here, so a move
inside the package cannot break a user's import, and ``import tidemark`` stays cheap."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import tidemark

PUBLIC = {
    "ApplySpec", "ArrowConverter", "AvroConverter", "ChangeEvent", "ConfigError",
    "DebeziumJsonConverter", "DeliveryMode", "Engine", "EngineConfig", "EventConverter",
    "ExtractNewRecordState", "FileOffsetStore", "Filter", "HashField", "LayeredOffsetStore",
    "MariaDbReader", "MariaDbSourceConfig", "MariaDbConnector",
    "LogTableSourceConfig", "LogTableConnector",
    "MaskField", "MemoryOffsetStore", "Op", "PostgresReader", "PostgresOffsetStore",
    "PostgresSourceConfig", "PostgresConnector", "Route", "SourceBatch",
    "SourceConnector", "SourceError", "SourceTask",
    "SourceUnavailableError", "SqliteOffsetStore", "TidemarkError", "UNAVAILABLE",
    "apply_changes", "changes_from_debezium_file", "changes_from_debezium_json",
    "send_signal", "spark", "verify",
}


def test_the_public_names_are_pinned() -> None:
    assert set(tidemark.__all__) == PUBLIC == {*tidemark._WHERE, "spark", "verify"}
    assert set(dir(tidemark)) >= PUBLIC


@pytest.mark.parametrize("name", sorted(PUBLIC - {"spark", "verify"}))
def test_each_public_name_is_the_object_its_module_defines(name: str) -> None:
    value = getattr(tidemark, name)
    module = importlib.import_module(tidemark._WHERE[name])
    assert value is getattr(module, name)


def test_verify_is_its_package_and_calling_it_runs_a_verify() -> None:
    from tidemark.verify import run  # noqa: PLC0415 - the lazy import is under test

    assert tidemark.verify is importlib.import_module("tidemark.verify")
    assert callable(tidemark.verify)
    result = tidemark.verify("/nonexistent/pipeline.toml", record=False)
    assert isinstance(result, run.VerifyResult) and result.exit_code == 2


def test_an_unknown_name_lists_the_public_ones() -> None:
    with pytest.raises(AttributeError, match=r"public names are: .*Engine, EngineConfig"):
        tidemark.Engin  # noqa: B018 - the lookup is the test


def test_import_tidemark_loads_neither_spark_nor_delta_nor_the_engine() -> None:
    code = ("import sys, tidemark\n"
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'pyspark', 'deltalake',"
             " 'pyarrow', 'psycopg', 'numpy'})\n"
            "engine = [m for m in sys.modules if m.startswith('tidemark.')]\n"
            "print(heavy, engine)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[] []"
    code = ("import sys\nfrom tidemark import Engine, FileOffsetStore, PostgresConnector"
            "\nprint('pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
