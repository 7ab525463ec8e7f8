"""What tidemark knows of one kind of source, asked of an object instead of its name.

A :class:`SourceKind` is the one place that knows a source: which connection strings
are its own, how to check and redact them, how a capture starts on it, how its log
positions read and compare, how far a pipeline is behind it, what a pipeline's
checkpoint records of it, how its status is taken, and its Spark read plan.
Everything above ``source/`` (the capture command, the Spark stream, ``tidemark run``,
``tidemark status``) asks the kind :func:`tidemark.source.registry.kind_of` returns,
and never compares kinds' names.

The built-in kinds live in their sources' folders (``source/postgres/kind.py``,
``source/mariadb/kind.py``, ``source/logtable/kind.py``); their methods import the
implementation when called, so a PostgreSQL capture never imports PyMySQL and
``import tidemark`` never imports pyspark. A kind in another package registers itself
with :func:`tidemark.source.registry.register` or through the ``tidemark.sources``
entry-point group.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from tidemark.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

    from tidemark.event import TableId
    from tidemark.serde.debezium_json import DebeziumJsonOptions
    from tidemark.source.read_plan import ReadOptions, ReadPlan
    from tidemark.source.repair_signal import KeyValue
    from tidemark.source.spi import SourceConnector
    from tidemark.source.verify_snapshot import VerifySnapshot

Row = tuple[Any, ...]

#: The Spark stream's options that only log tables have.
_LOG_TABLE_OPTIONS: Final = ("retentionS", "readerName")


class CaptureOptionError(ConfigError):
    """``tidemark capture`` was given an option this kind of source does not have (the
    command reports it as a usage error)."""

    def __init__(self, message: str) -> None:
        super().__init__("capture", message)
        self.text = message


@dataclasses.dataclass(frozen=True)
class CaptureRequest:
    """What ``tidemark capture`` was asked for, as plain values.

    ``values`` are the PostgreSQL connector's settings (the names of
    :class:`~tidemark.source.postgres.config.PostgresSourceConfig`); ``given`` the
    command-line options given explicitly (their parameter names), so that a kind can
    refuse what it does not have instead of ignoring it.
    """

    values: Mapping[str, Any]
    given: frozenset[str]
    topic_prefix: str
    tombstones: bool
    transaction_metadata: bool
    cells: bool
    tasks: int
    task_index: int
    retention_s: float
    saves_offsets: bool
    stop_at_end: bool = False
    """Finish once everything committed before the start is delivered."""


@dataclasses.dataclass
class Capture:
    """A capture built for one kind: the connector the engine runs (its start settings,
    such as where to stop, already in it) and how its events are written."""

    connector: SourceConnector
    options: DebeziumJsonOptions
    log_behind: Callable[[int], int] | None = None
    """Bytes of log written after a position (the progress line's lag); None: unknown."""
    position_text: Callable[[int], str] | None = None
    """A position as the progress line writes it (None: a number)."""
    slot_keeps_position: bool = False
    """The source keeps the position confirmed to it without --offsets (a slot)."""


class SourceProgress(abc.ABC):
    """How far a running pipeline is behind its source, and how much log a batch spans;
    may hold a connection between batches (:meth:`close` lets it go)."""

    @abc.abstractmethod
    def lag_bytes(self, end: Mapping[str, Any]) -> int:
        """Bytes of source log written after a batch's end offset *end*."""

    @abc.abstractmethod
    def batch_bytes(self, start: Mapping[str, Any] | None,
                    end: Mapping[str, Any]) -> int | None:
        """Bytes of source log from offset *start* (None: the first batch of a query) to
        *end*; None when unknown."""

    def close(self) -> None:  # noqa: B027 - nothing to release unless a kind holds some
        """Release what the progress holds (connections)."""


@dataclasses.dataclass(frozen=True)
class StatusModules:
    """Where a source's ``tidemark status`` lives (imported on first use): *capture*
    has ``status_of_capture(dsn, *, slot, offsets, topic_prefix)`` and
    ``render_capture(status)``, *pipeline* ``pipeline_status(pipeline)`` (*pipeline* a
    :class:`tidemark.status.pipeline.PipelineFacts`: what the status reads of the
    pipeline's file) and ``render_pipeline(status)``; each status is a JSON-able dict."""

    capture: str
    pipeline: str


class SourceKind(abc.ABC):
    """One kind of source (see the module docstring)."""

    #: The kind's name: ``postgres``, ``mariadb``, ``logtable`` (a pipeline's
    #: checkpoint records it).
    name: str = ""
    #: The ``--source`` / ``[source] kind`` values that ask for this kind.
    requested_names: tuple[str, ...] = ()
    #: What a pipeline identity calls where the log is (``database``, ``server``).
    place: str = "database"
    #: The Spark offsets carry the snapshot plan (PostgreSQL's
    #: :class:`~tidemark.source.postgres.stream_offsets.SourceOffset`) instead of the list of
    #: tables a batch ``loaded``.
    plans_snapshots_in_offset: bool = False
    def __repr__(self) -> str:
        return f"<source kind {self.name}>"

    # -- which DSNs ----------------------------------------------------------------
    @abc.abstractmethod
    def claims(self, dsn: str, requested: str | None) -> bool:
        """True if *dsn* (stripped, lower case) is this kind's, with the *requested*
        kind (``--source``; None when not given); raises ConfigError if the DSN is its
        own but the requested kind cannot read it."""

    # -- configuration ------------------------------------------------------------
    @abc.abstractmethod
    def check_dsn(self, dsn: str, key: str) -> None:
        """Raise ConfigError (naming *key*) if *dsn* is not a valid DSN of this kind."""

    @abc.abstractmethod
    def redact_dsn(self, dsn: str) -> str:
        """*dsn* without its password, for logs and errors."""

    def default_schema(self, dsn: str) -> str:
        """The schema of a table named without one."""
        return "public"

    def spark_option_refusal(self, option: str, value: str | None) -> str | None:
        """Why this kind refuses the Spark *option* given *value* (None: not given);
        None if it takes it. Only log tables have a reader name and a retention."""
        if option in _LOG_TABLE_OPTIONS and value is not None:
            return "applies to log tables only"
        return None

    # -- capture ----------------------------------------------------------------------
    @abc.abstractmethod
    def capture(self, request: CaptureRequest) -> Capture:
        """The capture ``tidemark capture`` runs on this kind."""

    # -- positions, lag, sizing -----------------------------------------------------
    @abc.abstractmethod
    def position_text(self, position: int) -> str:
        """A log position as people read it (an LSN, a binlog file and offset)."""

    @abc.abstractmethod
    def log_position(self, offset: Mapping[str, Any]) -> int:
        """A Spark offset's position in the source's log, in bytes."""

    @abc.abstractmethod
    def progress(self, dsn: str, *, slot: str, tables: Sequence[str]) -> SourceProgress:
        """The lag and batch sizing of a pipeline reading *tables* (and *slot*)."""

    def check_before_start(self, dsn: str, *, slot: str, checkpoint: str) -> None:  # noqa: B027
        """Raise if the source cannot continue the *checkpoint*, or another process
        reads its *slot* (nothing by default)."""

    def note_before_start(self, dsn: str, *, slot: str,
                          publication: str) -> Callable[[], list[str]] | None:
        """Called before a pipeline's stream starts: the function that drops what the
        start then creates in the source (a slot, a publication; never what exists now),
        returning what it dropped, for a start that fails before its first batch is
        planned. None: a start creates nothing to undo."""
        return None

    def table_columns(self, dsn: str,
                      tables: Sequence[str]) -> Mapping[str, Sequence[str]] | None:
        """The columns each of *tables* has in the source's catalog now, asked before
        anything is created (no slot, no publication) so that a pipeline's settings
        naming a column are checked before it starts; a table the source does not have
        is left out. None: the kind cannot tell before it starts (nothing is checked)."""
        return None

    def reader_options(self, *, slot: str, publication: str, checkpoint: str,
                       slot_failover: bool | None) -> dict[str, str]:
        """The Spark options that tell a pipeline's stream where to read."""
        return {"slot": slot, "publication": publication,
                **({"slotFailover": str(slot_failover).lower()}
                   if slot_failover is not None else {})}

    # -- pipelines ----------------------------------------------------------------------
    @abc.abstractmethod
    def identity_database(self, dsn: str) -> str:
        """Where the source's log is, as a pipeline's checkpoint records it (read from
        *dsn* alone: the server is not asked)."""

    def identity_slot(self, slot: str) -> str | None:
        """The slot a pipeline's identity records (None: the kind has none)."""
        return None

    def knows_column_defaults(self, dsn: str) -> bool:
        """Its catalog tells the values existing rows hold in a column added later."""
        return False

    def existing_row_values(self, dsn: str, table: str,
                            columns: Sequence[str]) -> dict[str, Any]:
        """The values *table*'s existing rows hold in *columns* (empty: unknown)."""
        return {}

    def read_plan_module(self) -> str | None:
        """The module whose ``make_read_plan(options)`` gives the Spark stream this
        kind's :class:`~tidemark.source.read_plan.ReadPlan` (imported on first use; what
        warming Spark's Python workers imports); None if it has none."""
        return None

    def read_plan(self, options: ReadOptions) -> ReadPlan:
        """The read plan of a Spark stream on this kind (by default
        :meth:`read_plan_module`'s ``make_read_plan(options)``); a kind defined
        elsewhere may return its plan directly."""
        module = self.read_plan_module()
        if module is None:
            raise ConfigError("source", f"{self.name} sources cannot be read by Spark "
                              "(the kind has no read plan)")
        made: ReadPlan = importlib.import_module(module).make_read_plan(options)
        return made

    def status_modules(self) -> StatusModules:
        """Where ``tidemark status`` of this kind lives."""
        raise ConfigError("source", f"tidemark status does not know {self.name} sources "
                          "(the kind has no status)")

    # -- signals ------------------------------------------------------------------------
    def write_signal(self, dsn: str, table: TableId, signal_id: str, signal_type: str,
                     data: str | None) -> None:
        """Insert a checked signal row (*signal_id*, *signal_type*, *data*: its JSON
        text) into the signal *table* (:func:`tidemark.source.signals.send_signal`);
        raises :class:`~tidemark.source.signals.SignalError` naming what to fix."""
        from tidemark.source.signals import SignalError  # noqa: PLC0415

        raise SignalError(f"{self.name} sources have no signal table (the kind has no "
                          "write_signal)")

    def taken_signals(self, offset: Mapping[str, Any] | None) -> frozenset[str] | None:
        """The ids of the signal rows a Spark stream had taken when it wrote *offset*
        (its batch's end offset); None when it had not read its signal table yet (the
        rows there when it first does are history, never taken). The read plans of
        every kind keep them under ``signals`` (:mod:`tidemark.source.signal_requests`)."""
        ids = None if offset is None else offset.get("signals")
        return None if ids is None else frozenset(str(i) for i in ids)

    def reload_hint(self, table: str, signal_table: str | None) -> str:
        """How a user reloads *table*'s target whole: what ``tidemark verify --repair``
        suggests where single keys cannot mend it."""
        where = f" --signal-table {signal_table}" if signal_table else ""
        return f"tidemark signal execute-snapshot {table}{where} --dsn ..."

    def repair_key_value(self, text: str, target_type: pa.DataType) -> KeyValue:
        """A ``tidemark-repair`` signal's value of a key column from its canonical text
        (:mod:`tidemark.row_checksum`) and the target column's type
        (:func:`tidemark.source.repair_keys.key_value`: PostgreSQL's forms); raises
        :class:`~tidemark.source.repair_keys.RepairKeyError` for one it cannot name."""
        from tidemark.source.repair_keys import key_value  # noqa: PLC0415

        return key_value(text, target_type)

    # -- verify ----------------------------------------------------------------------
    def verified_position(self, offset: Mapping[str, Any], tables: Sequence[str]) -> int:
        """How far a pipeline whose last committed Spark offset is *offset* has brought
        the targets of *tables*: every change before this position is in them. 0 while
        one of them is still being loaded by a snapshot (its target is partial)."""
        return self.log_position(offset)

    def verify_snapshot(self, dsn: str, tables: Sequence[TableId], *,
                        publication: str, wait_s: float = 120.0) -> VerifySnapshot:
        """A snapshot of *tables* at an exact log position, for ``tidemark verify``
        (*publication*: the pipeline's, where the kind reads its log through one;
        *wait_s*: how long taking it may wait for the source, as PostgreSQL's slot
        waits for running transactions)."""
        raise ConfigError("source", f"{self.name} sources cannot be verified yet (the "
                          "kind has no verify_snapshot)")

    def carried_columns(self, dsn: str, tables: Sequence[str], *,
                        publication: str) -> Mapping[str, Sequence[str]] | None:
        """The columns of each of *tables* that the kind's stream carries to a target
        (what ``tidemark verify`` expects a target to hold); by default every column
        of :meth:`table_columns`. None: the kind cannot tell."""
        return self.table_columns(dsn, tables)

    # -- tests and demos ----------------------------------------------------------------
    def table_rows(self, dsn: str, table: str, columns: Sequence[str],
                   text_columns: Sequence[str], utc_columns: Sequence[str]) -> list[Row]:
        """The rows of *table* in *columns*, sorted by ``repr`` (*text_columns* as
        text, *utc_columns* as UTC instants), to compare with a Delta target."""
        raise ConfigError("source", f"{self.name} sources cannot be read for a "
                          "comparison (the kind has no table_rows)")
