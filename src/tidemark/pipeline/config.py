"""The ``pipeline.toml`` model, validated completely before Spark starts (MISSION U2).

Spark takes seconds to start and a streaming query may run for days, so every mistake a
file can hold is found here first: TOML syntax (with the line), unknown keys (named with
the allowed ones), a target table the source does not capture, bad ``apply_changes``
settings, a target path that holds something other than a Delta table, a checkpoint
directory that cannot be made or written, a DSN that is neither in the file nor in its
environment variable, a ``[source]`` setting the source would ignore (a slot for log
tables, a retention for PostgreSQL's WAL: refused by the kind, as the Spark source's
option that setting sets). Each raises :class:`tidemark.errors.ConfigError`
naming the key (``spark.checkpoint``, ``targets."public.orders".keys``).

Relative paths are resolved against the directory of the file, so a pipeline directory
can be moved or run from anywhere.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypeVar
from urllib.parse import unquote, urlparse

import msgspec

from tidemark.config_mapping import config_error_from
from tidemark.errors import ConfigError, unknown_key_error
from tidemark.event import TableId
from tidemark.lake.delta_target import check_target
from tidemark.lake.spec import ApplySpec, spec_from_mapping
from tidemark.lake.upkeep import UpkeepSettings
from tidemark.pipeline.directories import cannot_create
from tidemark.skipped_operations import names_skipped_operations, not_offered
from tidemark.source.kind import SourceKind
from tidemark.source.registry import kind_of
from tidemark.spark.options import (
    ALLOWED,
    DEFAULT_PUBLICATION,
    DEFAULT_SLOT,
    DEFAULT_SNAPSHOT_CHUNK_ROWS,
    RETENTION_S,
    SIGNAL_TABLE,
    OnSchemaChange,
    SnapshotMode,
)

DEFAULT_DSN_ENV: Final = "TIDEMARK_DSN"
_SECTIONS: Final = ("source", "spark", "targets", "changelog", "metrics", "upkeep")
_TABLE_NAME: Final = re.compile(r"[^.\s]+\.[^.\s]+")
# A URI scheme (s3://, abfss://): a target may be one (delta-rs reaches it with the
# target's storage options); the runner reads Spark's checkpoint files (query id, batch
# offsets) with plain file I/O, so the checkpoint and the change log must be local.
_URI: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
#: ``[source]`` settings named otherwise as the Spark source's options they set (the
#: others have the option's name).
_SPARK_OPTION_OF: Final = {"retention_s": RETENTION_S, "signal_table": SIGNAL_TABLE}

S = TypeVar("S", bound=msgspec.Struct)
Positive = Annotated[int, msgspec.Meta(gt=0)]


class SourceSection(msgspec.Struct, frozen=True):
    """``[source]``: where the changes come from (the Spark source's options)."""

    dsn: str | None = None
    dsn_env: str = DEFAULT_DSN_ENV
    kind: Literal["replication", "logtable"] | None = None
    """How a PostgreSQL database is read: its WAL (``replication``, the default) or its
    CDC log tables (``logtable``, see ``tidemark logtable install``). A ``sqlite:`` DSN
    is always log tables, a ``mariadb://`` one its binlog."""
    retention_s: float | None = None
    """Log tables: log rows the pipeline has committed past are deleted once older than
    this (default a day; negative: never). Only for ``kind = "logtable"`` / SQLite."""
    slot: str = DEFAULT_SLOT
    publication: str = DEFAULT_PUBLICATION
    tables: list[str] | None = None
    max_changes_per_trigger: Positive | None = msgspec.field(
        default=None, name="maxChangesPerTrigger")
    num_partitions: Positive | None = msgspec.field(default=None, name="numPartitions")
    on_schema_change: OnSchemaChange = msgspec.field(default=OnSchemaChange.FAIL,
                                                     name="onSchemaChange")
    reconnect_max_attempts: Annotated[int, msgspec.Meta(ge=0)] = 10
    """Restarts of the query from its checkpoint after PostgreSQL became unreachable (a
    restart, a failover) before the pipeline gives up; 0: stop at once."""
    reconnect_backoff_ms: Positive = 500
    """First delay before such a restart; doubles up to 30 s."""
    server_timeout_ms: Positive | None = msgspec.field(default=None, name="serverTimeoutMs")
    """Longest wait for one answer from PostgreSQL (the Spark source's option)."""
    snapshot_chunk_rows: Positive | None = msgspec.field(default=None,
                                                         name="snapshotChunkRows")
    """Rows per snapshot chunk (one Spark task reads one chunk); PostgreSQL's WAL only
    (None: not given, :attr:`chunk_rows` is the default)."""
    snapshot_chunks_per_trigger: Positive | None = msgspec.field(
        default=None, name="snapshotChunksPerTrigger")
    """Snapshot chunks per micro-batch (default: 2 per partition)."""
    signal_table: str | None = None
    """Debezium's signal table: ``execute-snapshot`` reloads the targets it names."""
    slot_failover: bool | None = msgspec.field(default=None, name="slotFailover")
    """Create the slot as a failover slot (PostgreSQL 17+); default: where supported."""

    @property
    def chunk_rows(self) -> int:
        """Rows per snapshot chunk, given or the default."""
        return self.snapshot_chunk_rows or DEFAULT_SNAPSHOT_CHUNK_ROWS


class SparkSection(msgspec.Struct, frozen=True):
    """``[spark]``: the session and the streaming query's trigger."""

    checkpoint: str
    master: str = "local[2]"
    app_name: str = "tidemark"
    trigger_interval_ms: Annotated[int, msgspec.Meta(ge=0)] | None = None
    available_now: bool = False
    conf: dict[str, str] = msgspec.field(default_factory=dict)
    collect_max_mb: Annotated[int, msgspec.Meta(ge=0)] = 64
    """A batch spanning more source log than this is not collected to the driver whole:
    the executors write it to Parquet in the checkpoint, and it is applied from there in
    steps (0: every batch)."""
    apply_step_rows: Positive = 500_000
    """Change rows of one table merged per step when a batch is applied from Parquet
    (or on the executors); the steps of a batch are committed to its Delta table as one
    commit."""
    apply_step_mb: Positive = 64
    """The same in MB of change rows (Arrow's size): a step ends at whichever comes
    first, so wide rows make smaller steps and memory does not grow with the width."""
    apply_on: Literal["driver", "executors"] = "driver"
    """Where batches are merged into Delta: ``driver`` collects each batch and merges it
    there; ``executors`` merges on Spark's executors, one task per target at least and
    a big batch of a big target split by key ranges, committed as one by the driver
    (:mod:`tidemark.pipeline.executor_apply`)."""
    apply_parts: Positive | None = None
    """Most tasks one target's batch is split into on the executors; default: Spark's
    default parallelism."""
    apply_part_mb: Annotated[int, msgspec.Meta(ge=0)] = 8
    """Source log per part of a split batch: a smaller batch is not worth the parts'
    branches (0: split every batch into ``apply_parts``)."""
    warm_workers: bool = True
    """Start the executors' Python workers, with tidemark imported, while the query
    starts (:mod:`tidemark.spark.worker_warmup`), so the first batch does not wait
    for them."""


class MetricsSection(msgspec.Struct, frozen=True):
    """``[metrics]``: a Prometheus endpoint while the pipeline runs."""

    port: Annotated[int, msgspec.Meta(ge=0, le=65535)]
    address: str = "0.0.0.0"


class ChangelogSection(msgspec.Struct, frozen=True):
    """``[changelog]``: the raw change rows as Parquet, one directory per batch."""

    path: str


@dataclasses.dataclass(frozen=True)
class Target:
    """One ``[targets."schema.table"]`` entry: a Delta table and how changes apply."""

    table: str
    path: str
    spec: ApplySpec
    snapshot: SnapshotMode = SnapshotMode.INITIAL
    """``initial``: the table's existing rows are loaded before its changes, on the
    pipeline's first start or when the target is added later; ``never``: changes only."""
    upkeep: UpkeepSettings = dataclasses.field(default_factory=UpkeepSettings)
    """Compaction, checkpoints, log cleanup and vacuum (``[upkeep]``, then the target's
    own ``upkeep = {…}``)."""
    storage_options: dict[str, str] | None = dataclasses.field(default=None, repr=False)
    """delta-rs' storage options for an object store (``AWS_REGION``, …); left out of
    ``repr``: they may hold credentials."""

    @property
    def local(self) -> bool:
        """Whether the target is a directory of this machine (not an object store)."""
        return not _URI.match(self.path)


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """A validated pipeline file. ``dsn`` is resolved (file or environment); it is never
    printed (``repr`` leaves it out)."""

    dsn: str = dataclasses.field(repr=False)
    source: SourceSection = dataclasses.field(repr=False)
    spark: SparkSection
    checkpoint: str
    targets: tuple[Target, ...]
    changelog: str | None
    tables: tuple[str, ...]
    """Every captured table: ``source.tables`` or, when left out, the targets' tables."""
    metrics: MetricsSection | None = None

    def with_available_now(self) -> PipelineConfig:
        """This pipeline with ``available_now = true`` (the CLI's ``--available-now``)."""
        spark = msgspec.structs.replace(self.spark, available_now=True,
                                        trigger_interval_ms=None)
        return dataclasses.replace(self, spark=spark)


def load_config(path: str | os.PathLike[str],
                environ: Mapping[str, str] | None = None) -> PipelineConfig:
    """Read and validate a pipeline file; raises ConfigError naming the bad key.
    Nothing is made: the checkpoint directory is checked to be makeable (the pipeline's
    start makes it)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError("config", f"cannot read {file}: {err.strerror or err}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        # tomllib's message carries "(at line L, column C)".
        raise ConfigError("config", f"{file} is not valid TOML: {err}") from None
    return parse_config(raw, base=file.resolve().parent,
                        environ=os.environ if environ is None else environ)


def parse_config(raw: Mapping[str, Any], *, base: Path,
                 environ: Mapping[str, str]) -> PipelineConfig:
    """Validate an already parsed TOML document (relative paths are taken from *base*)."""
    for key in raw:
        if key not in _SECTIONS:
            raise unknown_key_error("", key, _SECTIONS)
    source = _section(SourceSection, raw.get("source", {}), "source")
    dsn = _dsn(source, environ)
    # Before anything is made (the checkpoint, a target's directory): a setting the
    # source would ignore ends the start here.
    _check_source_settings(raw.get("source", {}), kind_of(dsn, source.kind), dsn)
    if source.signal_table is not None and not _TABLE_NAME.fullmatch(source.signal_table):
        raise ConfigError("source.signal_table", f"{source.signal_table!r} is not a table "
                          "name; expected schema.table, e.g. public.dbz_signal")
    spark = _section(SparkSection, _require(raw, "spark", "the [spark] section with "
                                            "'checkpoint'"), "spark",
                     required={"checkpoint": "a directory for Spark's checkpoint (offsets "
                               "and commits of the streaming query)"})
    if spark.available_now and spark.trigger_interval_ms is not None:
        raise ConfigError("spark.trigger_interval_ms", "set either trigger_interval_ms "
                          "or available_now = true, not both")
    raw_targets = _require(raw, "targets", 'at least one [targets."schema.table"] section '
                           "with a 'path'")
    if not isinstance(raw_targets, Mapping) or not raw_targets:
        raise ConfigError("targets", 'must hold [targets."schema.table"] sections')
    upkeep = _section(UpkeepSettings, raw.get("upkeep", {}), "upkeep")
    targets = tuple(_target(name, values, base, upkeep)
                    for name, values in raw_targets.items())
    tables = _tables(source, targets)
    changelog = None
    if "changelog" in raw:
        section = _section(ChangelogSection, raw["changelog"], "changelog",
                           required={"path": "a directory for the Parquet change log"})
        changelog = _local_path(section.path, base, "changelog.path")
    metrics = None
    if "metrics" in raw:
        metrics = _section(MetricsSection, raw["metrics"], "metrics",
                           required={"port": "the TCP port of the /metrics endpoint"})
    checkpoint = _local_path(spark.checkpoint, base, "spark.checkpoint")
    _check_disjoint(targets, checkpoint, changelog)
    return PipelineConfig(
        dsn=dsn, source=source, spark=spark,
        checkpoint=_checkpoint(checkpoint), targets=targets,
        changelog=changelog, tables=tables, metrics=metrics)


def _check_source_settings(given: Mapping[str, Any], kind: SourceKind, dsn: str) -> None:
    """Refuse a ``[source]`` setting *kind* has no use for: each sets a Spark source
    option, which the kind refuses as the Spark source does (one list for both)."""
    for key, value in given.items():
        option = _SPARK_OPTION_OF.get(key, key)
        if option not in ALLOWED:
            continue
        refusal = kind.spark_option_refusal(option, str(value))
        if refusal is not None:
            raise ConfigError(f"source.{key}", f"{refusal}: the source "
                              f"{kind.redact_dsn(dsn)} is read as {kind.name}; leave "
                              f"{key} out of [source]")


def _check_disjoint(targets: tuple[Target, ...], checkpoint: str,
                    changelog: str | None) -> None:
    """No two places the pipeline writes may be the same directory or nested: two
    targets in one path would merge two tables into one Delta table, and a table inside
    the checkpoint (or the reverse) would be deleted or corrupted with it."""
    places = [(f'targets."{t.table}".path', Path(t.path)) for t in targets if t.local]
    places.append(("spark.checkpoint", Path(checkpoint)))
    if changelog is not None:
        places.append(("changelog.path", Path(changelog)))
    for i, (key, path) in enumerate(places):
        for other_key, other in places[:i]:
            if path == other:
                raise ConfigError(key, f"{path} is also {other_key}: every target, the "
                                       "checkpoint and the changelog need their own directory")
            if path.is_relative_to(other) or other.is_relative_to(path):
                inner, outer = (key, other_key) if path.is_relative_to(other) else (
                    other_key, key)
                raise ConfigError(key, f"{path} and {other_key} ({other}) are nested "
                                       f"({inner} is inside {outer}): every target, the "
                                       "checkpoint and the changelog need their own "
                                       "directory, none inside another")


def _require(raw: Mapping[str, Any], key: str, what: str) -> Any:
    if key not in raw:
        raise ConfigError(key, f"required: {what}")
    return raw[key]


def _section(cls: type[S], values: object, section: str, *,
                                required: Mapping[str, str] | None = None) -> S:
    if not isinstance(values, Mapping):
        raise ConfigError(section, f"must be a table ([{section}]), got {values!r}")
    # The names users write (msgspec's encoded names, e.g. maxChangesPerTrigger).
    allowed = getattr(cls, "__struct_encode_fields__", cls.__struct_fields__)
    for key in values:
        if key not in allowed and names_skipped_operations(key):
            raise not_offered(f"{section}.{key}", "tidemark run",
                              "a target that skipped a delete or truncate would keep rows "
                              "its source no longer has; leave the setting out")
        if key not in allowed:
            raise unknown_key_error(section, key, allowed)
    for key, what in (required or {}).items():
        if key not in values:
            raise ConfigError(f"{section}.{key}", f"required: {what}")
    try:
        return msgspec.convert(dict(values), cls, str_keys=True)
    except msgspec.ValidationError as err:
        raise config_error_from(cls, err, section) from None


def _target(name: str, values: object, base: Path, upkeep: UpkeepSettings) -> Target:
    section = f'targets."{name}"'
    if not _TABLE_NAME.fullmatch(name):
        raise ConfigError(section, f"{name!r} is not a table name; write "
                          '[targets."schema.table"], e.g. [targets."public.orders"]')
    if not isinstance(values, Mapping):
        raise ConfigError(section, f"must be a table with 'path' and apply settings, "
                          f"got {values!r}")
    settings = dict(values)
    allowed = {"path", "snapshot", "upkeep", "storage_options"} | {
        f.name for f in dataclasses.fields(ApplySpec)} - {"apply_as_deletes",
                                                          "apply_as_truncates"}
    for key in settings:
        if key not in allowed:
            raise unknown_key_error(section, key, allowed)
    if "path" not in settings:
        raise ConfigError(f"{section}.path", "required: the Delta table's directory")
    path = settings.pop("path")
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{section}.path", f"must be a directory path, got {path!r}")
    options = settings.pop("storage_options", None)
    overrides = settings.pop("upkeep", {})
    if overrides:
        upkeep = _section(UpkeepSettings, {**msgspec.structs.asdict(upkeep), **overrides}
                          if isinstance(overrides, Mapping) else overrides,
                          f"{section}.upkeep")
    snapshot = settings.pop("snapshot", SnapshotMode.INITIAL.value)
    try:
        mode = SnapshotMode(snapshot)
    except ValueError:
        raise ConfigError(f"{section}.snapshot", f"{snapshot!r} is not allowed; choose "
                          f"{' or '.join(repr(m.value) for m in SnapshotMode)}") from None
    try:
        spec = spec_from_mapping(settings)
    except ConfigError as err:
        # ApplySpec names its own setting; say which target it belongs to.
        message = str(err).removeprefix(f"{err.key}: ")
        raise ConfigError(f"{section}.{err.key}", message) from None
    except TypeError as err:  # a required ApplySpec field (keys) left out
        raise ConfigError(f"{section}.keys", f"required: the key columns ({err})") from None
    storage_options = _storage_options(options, f"{section}.storage_options")
    if path.startswith("file://"):
        path = unquote(urlparse(path).path)
    if _URI.match(path):
        resolved = path  # an object store: delta-rs reaches it with the storage options
    else:
        resolved = _local_path(path, base, f"{section}.path")
        try:
            check_target(resolved)  # here, before Spark starts and the source is read
        except ConfigError as err:
            raise ConfigError(f"{section}.path",
                              str(err).removeprefix(f"{err.key}: ")) from None
    return Target(table=str(TableId.parse(name)), path=resolved, spec=spec, snapshot=mode,
                  upkeep=upkeep, storage_options=storage_options)


def _storage_options(values: object, key: str) -> dict[str, str] | None:
    if values is None:
        return None
    if not isinstance(values, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
        raise ConfigError(key, "must be a table of strings, delta-rs' storage options "
                               '(e.g. { AWS_REGION = "eu-west-1" })')
    return dict(values)


def _tables(source: SourceSection, targets: tuple[Target, ...]) -> tuple[str, ...]:
    names = [t.table for t in targets]
    if source.tables is None:
        return tuple(names)
    captured: list[str] = []
    for name in source.tables:
        if not _TABLE_NAME.fullmatch(name):
            raise ConfigError("source.tables", f"{name!r} is not a table name; expected "
                              "schema.table, e.g. public.orders")
        captured.append(str(TableId.parse(name)))
    for name in names:
        if name not in captured:
            raise ConfigError(f'targets."{name}"', f"table {name} is not captured: add it "
                              f"to source.tables ({', '.join(captured)})")
    return tuple(captured)


def _dsn(source: SourceSection, environ: Mapping[str, str]) -> str:
    if source.dsn:
        return source.dsn
    value = environ.get(source.dsn_env, "").strip()
    if not value:
        raise ConfigError("source.dsn", f"no connection string: set source.dsn, or the "
                          f"environment variable {source.dsn_env} (source.dsn_env) to keep "
                          "the password out of the file")
    return value


def _local_path(path: str, base: Path, key: str) -> str:
    if _URI.match(path):
        raise ConfigError(key, f"{path!r}: only local paths are supported")
    return str((base / Path(path).expanduser()).resolve())


def _checkpoint(path: str) -> str:
    """*path* if the checkpoint directory exists writable or can be made (it is made
    when the pipeline starts, after its checks: a refused start leaves none)."""
    resolved = Path(path)
    if resolved.is_dir() and not os.access(resolved, os.W_OK | os.X_OK):
        raise ConfigError("spark.checkpoint", f"{resolved} is not a writable directory")
    reason = cannot_create(resolved)
    if reason is not None:
        raise ConfigError("spark.checkpoint", f"cannot create {resolved}: {reason}")
    return str(resolved)
