"""tidemark: change data capture for Python and Apache Spark.

The names a user needs are importable from here, the one place to obtain them (``from
tidemark import Engine, PostgresConnector, MariaDbConnector, FileOffsetStore,
apply_changes``); the
modules under ``tidemark.*`` are internal and may move. Each name is loaded on first
use, so ``import tidemark`` stays cheap: the capture command starts in a quarter of a
second, and pyspark is never imported unless ``tidemark.spark`` is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_WHERE: dict[str, str] = {
    # the change event
    "ChangeEvent": "tidemark.event",
    "Op": "tidemark.event",
    "UNAVAILABLE": "tidemark.event",
    # PostgreSQL: a connector to poll directly, and the engine's connector
    "PostgresReader": "tidemark.source.postgres.reader",
    "PostgresSourceConfig": "tidemark.source.postgres.config",
    "PostgresConnector": "tidemark.source.postgres.task",
    "send_signal": "tidemark.source.signals",
    # MariaDB (and MySQL-protocol servers): the same two
    "MariaDbReader": "tidemark.source.mariadb.reader",
    "MariaDbSourceConfig": "tidemark.source.mariadb.config",
    "MariaDbConnector": "tidemark.source.mariadb.task",
    # CDC log tables (PostgreSQL, SQLite): the engine's connector and its settings
    "LogTableSourceConfig": "tidemark.source.logtable.config",
    "LogTableConnector": "tidemark.source.logtable.task",
    # writing a source of your own
    "SourceConnector": "tidemark.source.spi",
    "SourceTask": "tidemark.source.spi",
    "SourceBatch": "tidemark.source.batch",
    # the embedded engine
    "Engine": "tidemark.engine.engine",
    "EngineConfig": "tidemark.engine.config",
    "DeliveryMode": "tidemark.engine.config",
    "DebeziumJsonConverter": "tidemark.engine.converters",
    "EventConverter": "tidemark.engine.converters",
    "AvroConverter": "tidemark.engine.avro_converter",
    "ArrowConverter": "tidemark.engine.arrow_converter",
    "Filter": "tidemark.engine.transforms",
    "Route": "tidemark.engine.transforms",
    "ExtractNewRecordState": "tidemark.engine.transforms",
    "MaskField": "tidemark.engine.transforms",
    "HashField": "tidemark.engine.transforms",
    # offset stores
    "FileOffsetStore": "tidemark.offsets.file",
    "SqliteOffsetStore": "tidemark.offsets.sqlite",
    "PostgresOffsetStore": "tidemark.offsets.postgres",
    "MemoryOffsetStore": "tidemark.offsets.memory",
    "LayeredOffsetStore": "tidemark.offsets.layered",
    # Delta Lake
    "ApplySpec": "tidemark.lake",
    "apply_changes": "tidemark.lake",
    "changes_from_debezium_json": "tidemark.lake",
    "changes_from_debezium_file": "tidemark.lake",
    # errors
    "TidemarkError": "tidemark.errors",
    "ConfigError": "tidemark.errors",
    "SourceError": "tidemark.errors",
    "SourceUnavailableError": "tidemark.errors",
}

# Literal, for tools that read it without running this module; the test pins it to
# _WHERE's names.
__all__ = [
    "UNAVAILABLE",
    "ApplySpec",
    "ArrowConverter",
    "AvroConverter",
    "ChangeEvent",
    "ConfigError",
    "DebeziumJsonConverter",
    "DeliveryMode",
    "Engine",
    "EngineConfig",
    "EventConverter",
    "ExtractNewRecordState",
    "FileOffsetStore",
    "Filter",
    "HashField",
    "LayeredOffsetStore",
    "LogTableConnector",
    "LogTableSourceConfig",
    "MariaDbConnector",
    "MariaDbReader",
    "MariaDbSourceConfig",
    "MaskField",
    "MemoryOffsetStore",
    "Op",
    "PostgresConnector",
    "PostgresOffsetStore",
    "PostgresReader",
    "PostgresSourceConfig",
    "Route",
    "SourceBatch",
    "SourceConnector",
    "SourceError",
    "SourceTask",
    "SourceUnavailableError",
    "SqliteOffsetStore",
    "TidemarkError",
    "apply_changes",
    "changes_from_debezium_file",
    "changes_from_debezium_json",
    "send_signal",
    "spark",
    "verify",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time, __getattr__ loads
    from tidemark import spark, verify
    from tidemark.engine.arrow_converter import ArrowConverter
    from tidemark.engine.avro_converter import AvroConverter
    from tidemark.engine.config import DeliveryMode, EngineConfig
    from tidemark.engine.converters import DebeziumJsonConverter, EventConverter
    from tidemark.engine.engine import Engine
    from tidemark.engine.transforms import (
        ExtractNewRecordState,
        Filter,
        HashField,
        MaskField,
        Route,
    )
    from tidemark.errors import ConfigError, SourceError, SourceUnavailableError, TidemarkError
    from tidemark.event import UNAVAILABLE, ChangeEvent, Op
    from tidemark.lake import (
        ApplySpec,
        apply_changes,
        changes_from_debezium_file,
        changes_from_debezium_json,
    )
    from tidemark.offsets.file import FileOffsetStore
    from tidemark.offsets.layered import LayeredOffsetStore
    from tidemark.offsets.memory import MemoryOffsetStore
    from tidemark.offsets.postgres import PostgresOffsetStore
    from tidemark.offsets.sqlite import SqliteOffsetStore
    from tidemark.source.batch import SourceBatch
    from tidemark.source.mariadb.config import MariaDbSourceConfig
    from tidemark.source.mariadb.reader import MariaDbReader
    from tidemark.source.mariadb.task import MariaDbConnector
    from tidemark.source.postgres.config import PostgresSourceConfig
    from tidemark.source.postgres.reader import PostgresReader
    from tidemark.source.postgres.task import PostgresConnector
    from tidemark.source.signals import send_signal
    from tidemark.source.spi import SourceConnector, SourceTask


def __getattr__(name: str) -> Any:
    if name == "spark":  # the PySpark helpers: imports pyspark
        return importlib.import_module("tidemark.spark")
    if name == "verify":  # the package, callable as tidemark.verify.verify
        return importlib.import_module("tidemark.verify")
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tidemark' has no attribute {name!r}; its public "
                             f"names are: {', '.join(__all__)}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
