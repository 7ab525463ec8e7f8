"""The sources the Spark stream reads, and what a source provides to be one of them.

The stream (:mod:`tidemark.spark.source`) knows a source only through
:class:`SparkSource`: a package under ``tidemark/spark/`` (``postgres/``, ``mariadb/``,
``logtable/``) with a ``table_schemas`` function and a reader class, which its source
kind names (:meth:`tidemark.source.kind.SourceKind.spark_source`). The reader is a
pyspark ``DataSourceStreamReader``: offsets, partitions and ``read`` are the source's
own, and ``read`` hands its changes to the shared sinks
(:func:`tidemark.spark.stream_sink.stream_sink`): as pgoutput row blocks, the sinks'
native input (the PostgreSQL reader's vectorized path, :mod:`tidemark.spark.decode`),
or as change events through :class:`tidemark.spark.event_feeder.EventFeeder`, as the
MariaDB and log-table readers do. Adding a source is a new package and a source kind
that names it.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Any, Protocol

from tidemark.source.kind import SourceKind
from tidemark.source.registry import kind_named

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql.datasource import DataSourceStreamReader
    from pyspark.sql.types import StructType

    from tidemark.event import TableId
    from tidemark.spark.options import SourceOptions


class SparkSource(Protocol):
    """What a source gives the Spark stream."""

    def table_schemas(self, options: SourceOptions) -> dict[TableId, StructType]:
        """Check what can be checked before a query starts (the server, privileges,
        the tables and their keys) and return each table's typed Spark schema (key
        columns marked ``{"tidemark.key": true}``), raising a SourceError that says
        what to fix."""
        ...

    def stream_reader(self, options: SourceOptions,
                      schema: StructType) -> DataSourceStreamReader:
        """The reader of a query of the stream whose schema is *schema*."""
        ...


@dataclasses.dataclass(frozen=True)
class _Source:
    """A source by where its two parts live, imported on first use: a PostgreSQL
    stream never imports the MariaDB client, nor the reverse, and ``tidemark status``
    reads a source's offsets without importing pyspark."""

    schemas: str  # the module with ``table_schemas(options)``
    reader: str  # the module of the reader class
    reader_class: str  # ``reader_class(options, schema)`` is the stream reader

    def table_schemas(self, options: SourceOptions) -> dict[TableId, StructType]:
        checked: Callable[[SourceOptions], dict[TableId, StructType]] = \
            importlib.import_module(self.schemas).table_schemas
        return checked(options)

    def stream_reader(self, options: SourceOptions,
                      schema: StructType) -> DataSourceStreamReader:
        reader: Any = getattr(importlib.import_module(self.reader), self.reader_class)
        made: DataSourceStreamReader = reader(options, schema)
        return made


def _source(kind: SourceKind) -> _Source:
    modules = kind.spark_source()
    return _Source(modules.schemas, modules.reader, modules.reader_class)


def reader_module(kind: str) -> str:
    """The module a source's ``read`` runs from on the executors (the kind's name:
    ``postgres``, ``mariadb``, ``logtable``, a plugin's): what warming their Python
    workers imports."""
    return kind_named(kind).spark_source().reader


def spark_source(options: SourceOptions) -> SparkSource:
    """The source *options* name (its kind, chosen by the DSN and ``source``)."""
    return _source(options.source_kind)


if TYPE_CHECKING:  # mypy checks each source's two parts against SparkSource
    from tidemark.spark.logtable import reader as _logtable
    from tidemark.spark.mariadb import reader as _mariadb
    from tidemark.spark.postgres import reader as _postgres
    from tidemark.spark.postgres import schema as _postgres_schema

    _SCHEMAS: tuple[Callable[[SourceOptions], dict[TableId, StructType]], ...] = (
        _postgres_schema.table_schemas, _mariadb.table_schemas, _logtable.table_schemas)
    _READERS: tuple[Callable[[SourceOptions, StructType], DataSourceStreamReader], ...] = (
        _postgres.TidemarkStreamReader, _mariadb.MariaDbStreamReader,
        _logtable.LogTableStreamReader)
