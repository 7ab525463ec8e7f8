"""Which pipeline a checkpoint belongs to, kept beside Spark's files and checked first.

Spark's checkpoint holds positions in one source's log (a slot's WAL, a server's binlog,
a database's log tables) and the query id the targets' Delta commits are tagged with.
Another pipeline started on it would read those positions as its own, plan its own
batches into it and break the owner for good. So the first start records the owner in
``<checkpoint>/tidemark-pipeline.json``, and every start compares itself with it before
anything is written (to the checkpoint, the targets or the server: slot, publication).

What makes a pipeline's identity, and what may change:

* the source kind (``postgres``, ``mariadb``, ``logtable``): the offsets' format;
* where its log is: PostgreSQL's database and slot (not the host: a failover slot
  moves to a standby under another address), MariaDB's server (``host:port``), a
  SQLite file's absolute path, the PostgreSQL database of log tables;
* its targets (table and Delta path): targets may be added and removed, so a pipeline
  matches if it keeps at least one target of the record; the record then follows the
  current targets. A pipeline with none of them is another pipeline.

A checkpoint written before this record existed is adopted, unless the targets its
batches wrote to (``tidemark-targets.json``) are none of this pipeline's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

import msgspec

from tidemark.atomic_file import write_atomically
from tidemark.errors import ConfigError
from tidemark.lake import written_targets
from tidemark.pipeline.config import PipelineConfig
from tidemark.source.registry import kind_named, kind_of

log = logging.getLogger(__name__)

#: The record's file in the checkpoint directory (Spark ignores files it does not know).
FILE_NAME: Final = "tidemark-pipeline.json"

#: What a checkpoint holds once a query ran on it (Spark's files, tidemark's records).
_USED: Final = ("metadata", "offsets", "commits", "sources", written_targets.FILE_NAME)


class CheckpointOwnerError(ConfigError):
    """The checkpoint belongs to another pipeline (nothing was written)."""


class PipelineIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """A pipeline as its checkpoint knows it (see the module docstring)."""

    source: str
    database: str
    slot: str | None = None
    targets: dict[str, str] = msgspec.field(default_factory=dict)
    """Table name to Delta table path."""

    def describe(self) -> str:
        """One line: ``postgres database app, slot s, targets public.a -> /lake/a``."""
        where = _place(self.source)
        slot = f", slot {self.slot}" if self.slot is not None else ""
        targets = ", ".join(f"{t} -> {p}" for t, p in sorted(self.targets.items()))
        return f"{self.source} {where} {self.database}{slot}, targets {targets or 'none'}"

    def mismatch(self, other: PipelineIdentity) -> str | None:
        """Why *other* is not this pipeline; None if it is (see the module docstring)."""
        if other.source != self.source:
            return f"its source is {self.source}, not {other.source}"
        if other.database != self.database:
            return f"its source is {self.database}, not {other.database}"
        if other.slot != self.slot:
            return f"its slot is {self.slot}, not {other.slot}"
        if not set(self.targets.items()) & set(other.targets.items()):
            return "it has none of these targets"
        return None


def identity_of(config: PipelineConfig) -> PipelineIdentity:
    """*config*'s identity (read from the file alone: the server is not asked)."""
    kind = kind_of(config.dsn, config.source.kind)
    return PipelineIdentity(source=kind.name, database=kind.identity_database(config.dsn),
                            slot=kind.identity_slot(config.source.slot),
                            targets={t.table: t.path for t in config.targets})


def _place(name: str) -> str:
    """What the kind called *name* calls where its log is (``database`` for a kind this
    tidemark does not know, e.g. a plugin's no longer installed)."""
    try:
        return kind_named(name).place
    except ConfigError:
        return "database"


def claim_checkpoint(config: PipelineConfig) -> None:
    """Make sure *config*'s checkpoint is this pipeline's, before anything is written.

    Raises :class:`CheckpointOwnerError` (and writes nothing) if it belongs to another
    pipeline; records this pipeline as its owner on a first start, and its targets when
    they changed.
    """
    ours = identity_of(config)
    file = Path(config.checkpoint) / FILE_NAME
    recorded = _read(file)
    if recorded is None:
        _check_unrecorded(config, ours)
    else:
        reason = recorded.mismatch(ours)
        if reason is not None:
            raise CheckpointOwnerError(
                "spark.checkpoint", f"{config.checkpoint} belongs to another pipeline "
                f"({recorded.describe()}; {reason}); this pipeline is "
                f"{ours.describe()}. Nothing was written: give this pipeline its own "
                f"spark.checkpoint directory (if the checkpoint is this pipeline's own "
                f"and its source moved, delete {file} to adopt it)")
        if recorded == ours:
            return
        log.info("checkpoint %s: the pipeline's targets are now %s", config.checkpoint,
                 ours.describe())
    write_atomically(file, msgspec.json.encode(ours))


def _read(file: Path) -> PipelineIdentity | None:
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ConfigError("spark.checkpoint", f"cannot read {file}: "
                          f"{err.strerror or err}") from None
    try:
        return msgspec.json.decode(data, type=PipelineIdentity)
    except msgspec.DecodeError as err:
        raise ConfigError("spark.checkpoint", f"{file} is not tidemark's record of the "
                          f"pipeline the checkpoint belongs to ({err}); restore it, or "
                          "delete it to have this pipeline adopt the checkpoint") from None


def _check_unrecorded(config: PipelineConfig, ours: PipelineIdentity) -> None:
    """A checkpoint with no owner recorded: new, or written before the record existed;
    then the targets its batches wrote to must include one of this pipeline's."""
    checkpoint = Path(config.checkpoint)
    if not any((checkpoint / name).exists() for name in _USED):
        return
    try:
        written = written_targets.WrittenTargets(config.checkpoint).recorded()
    except written_targets.TargetLostError:
        return  # unreadable: the targets' own check says so with its remedy
    if written and not set(written.items()) & set(ours.targets.items()):
        theirs = ", ".join(f"{t} -> {p}" for t, p in sorted(written.items()))
        raise CheckpointOwnerError(
            "spark.checkpoint", f"{config.checkpoint} belongs to another pipeline (its "
            f"batches wrote to {theirs}); this pipeline is {ours.describe()}. Nothing was "
            f"written: give this pipeline its own spark.checkpoint directory")
