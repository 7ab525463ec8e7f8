"""What the status of every ``tidemark run`` pipeline shares, whatever its source: what
it reads of the pipeline's file, its Delta targets, its last run and the checkpoint's
last committed batch.

Everything comes from files, so it can run while the pipeline runs: each target's Delta
log (version, row count from the files' statistics, the batch id of the app transaction
``tidemark-<query id>-<table>``, time of the last commit), the targets the checkpoint
has written to (:mod:`tidemark.lake.written_targets`) and the run record the runner keeps
beside Spark's files (:mod:`tidemark.run_record`). pyspark is not imported.

The pipeline's file is read by ``tidemark status`` (:mod:`tidemark.cli.status`), which
hands its source's status module a :class:`PipelineFacts`: status sits below the
pipeline and knows nothing of its configuration's types.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from tidemark.lake.delta_log import read_log
from tidemark.lake.delta_read import has_deletion_vectors_feature
from tidemark.lake.upkeep import last_checkpoint
from tidemark.lake.written_targets import TargetLostError, WrittenTargets, exists
from tidemark.run_record import read_record
from tidemark.spark_checkpoint import committed_source_offset
from tidemark.status.report import human_bytes, iso_time
from tidemark.status.verify_record import verify_rows


@dataclasses.dataclass(frozen=True)
class PipelineTarget:
    """One target of the pipeline: a Delta table."""

    table: str
    path: str
    storage_options: dict[str, str] | None = dataclasses.field(repr=False)
    """delta-rs' storage options (may hold credentials: left out of ``repr``)."""
    local: bool
    """A directory of this machine (not an object store)."""
    initial_snapshot: bool
    """The table's existing rows are loaded before its changes (``snapshot =
    "initial"``)."""
    merge: str = "copy_on_write"
    """How batches are merged into it (``merge``: ``copy_on_write``, ``merge_on_read``
    or ``auto``)."""


@dataclasses.dataclass(frozen=True)
class PipelineFacts:
    """What a pipeline's status reads of its file, as plain values."""

    config_file: str
    """The pipeline file, as given."""
    dsn: str = dataclasses.field(repr=False)
    slot: str
    checkpoint: str
    """Spark's checkpoint directory."""
    targets: tuple[PipelineTarget, ...]
    snapshot_chunk_rows: int
    """Rows per chunk of a snapshot (how far a running one has come)."""

    @property
    def config(self) -> str:
        """The pipeline file's absolute path (the status's ``config`` key)."""
        return str(Path(self.config_file).resolve())


def committed_checkpoint(checkpoint: str, warnings: list[str]
                         ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The ``checkpoint`` keys ``path``, ``query_id`` and ``last_committed_batch``, and
    the source offset of that batch (None before the first); warns if the pipeline has
    not started."""
    query_id, committed, offset = committed_source_offset(checkpoint)
    section: dict[str, Any] = {"path": checkpoint, "query_id": query_id,
                               "last_committed_batch": committed}
    if query_id is None:
        warnings.append("the pipeline has not started yet")
    return section, offset


# -- Delta targets ---------------------------------------------------------------------

def target_sections(pipeline: PipelineFacts, query_id: str | None,
                    problems: list[str]) -> list[dict[str, Any]]:
    """The ``targets`` of the status, in the pipeline file's order."""
    return [target_section(t, pipeline.checkpoint, query_id, problems)
            for t in pipeline.targets]


def target_section(target: PipelineTarget, checkpoint: str, query_id: str | None,
                   problems: list[str]) -> dict[str, Any]:
    """One target's keys: its Delta table, and whether the checkpoint lost it."""
    app_id = f"tidemark-{query_id}-{target.table}" if query_id is not None else None
    section: dict[str, Any] = {
        "table": target.table, "path": target.path,
        "exists": exists(target), "lost": False,
        "delta_version": None, "rows": None, "files": None, "checkpoint_version": None,
        "app_id": app_id, "last_batch_id": None, "last_commit_at": None,
        "merge": target.merge, "deletion_vector_files": None, "deleted_rows": None,
        "deleted_fraction": None, "problem": None}
    try:
        WrittenTargets(checkpoint).check((target,))
    except TargetLostError as err:
        section["lost"] = True
        section["problem"] = str(err)
        problems.append(str(err))
        return section
    if not section["exists"]:
        return section  # no change applied to it yet
    try:
        delta = DeltaTable(target.path, storage_options=target.storage_options)
        section["delta_version"] = delta.version()
        section["rows"] = _row_count(delta)
        section["files"] = len(delta.file_uris())
        if target.local:
            section["checkpoint_version"] = last_checkpoint(Path(target.path))
            if has_deletion_vectors_feature(delta):
                section.update(_deletions(Path(target.path)))
                section["rows"] = section.pop("live_rows")
        if app_id is not None:
            section["last_batch_id"] = delta.transaction_version(app_id)
        history = delta.history(1)
        if history:
            section["last_commit_at"] = iso_time(int(history[0]["timestamp"]) / 1000)
    except (DeltaError, OSError, ValueError) as err:
        section["problem"] = f"cannot read the Delta table {target.path}: {err}"
        problems.append(section["problem"])
    return section


def _deletions(root: Path) -> dict[str, Any]:
    """A local table with deletion vectors: how many of its files have one, how many
    rows they mark deleted and what fraction of all rows that is, and its live rows,
    from its log (no data file is read)."""
    state = read_log(root)
    vectors = deleted = 0
    records: int | None = 0
    for add in state.files.values():
        dv = add.get("deletionVector")
        if dv:
            vectors += 1
            deleted += int(dv["cardinality"])
        stats = json.loads(add["stats"]) if add.get("stats") else {}
        if records is not None and stats.get("numRecords") is not None:
            records += int(stats["numRecords"])
        else:
            records = None
    return {"deletion_vector_files": vectors, "deleted_rows": deleted,
            "deleted_fraction": round(deleted / records, 4) if records else
            (None if records is None else 0.0),
            "live_rows": None if records is None else records - deleted}


def _row_count(delta: DeltaTable) -> int | None:
    """Rows of the table's current version from the statistics in its log (no data file
    is read); None when a file has no statistics or deletion vectors hide rows."""
    if "deletionVectors" in (delta.protocol().reader_features or []):
        return None
    actions = pa.table(delta.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0
    counts = actions.column("num_records")
    if counts.null_count:
        return None
    return int(pa.compute.sum(counts).as_py())


# -- the run record --------------------------------------------------------------------

def last_run_section(checkpoint: str, problems: list[str]) -> dict[str, Any] | None:
    """The ``last_run`` keys from the run record in *checkpoint* (None: no record)."""
    try:
        record = read_record(checkpoint)
    except (OSError, ValueError) as err:
        problems.append(f"cannot read the run record: {err}")
        return None
    if record is None:
        return None
    if record.outcome == "failed":
        problems.append(f"the last run failed: {record.error}")

    def when(moment: Any) -> str | None:
        return None if moment is None else iso_time(moment.timestamp())

    return {"started_at": when(record.started_at), "ended_at": when(record.ended_at),
            "outcome": record.outcome, "error": record.error,
            "last_batch_id": record.last_batch_id, "last_batch_at": when(record.last_batch_at),
            "last_batch_changes": record.last_batch_changes,
            "last_batch_lag_bytes": record.last_batch_lag_bytes,
            "last_batch_lag_seconds": record.last_batch_lag_seconds,
            "upkeep": record.upkeep or {}}


def run_line(run: dict[str, Any] | None) -> str:
    """The ``last run`` row of the human output."""
    if run is None:
        return "not recorded (no run since tidemark status was added)"
    outcome = run["outcome"]
    if outcome == "running":
        outcome = "running (or killed: no end was recorded)"
    elif outcome == "failed":
        outcome = f"failed at {run['ended_at']}: {run['error']}"
    elif run["ended_at"] is not None:
        outcome = f"{outcome} at {run['ended_at']}"
    text = f"started {run['started_at']}, {outcome}"
    if run["last_batch_id"] is not None:
        changes = sum((run["last_batch_changes"] or {}).values())
        seconds = run["last_batch_lag_seconds"]
        text += (f"; last batch {run['last_batch_id']} at {run['last_batch_at']}: "
                 f"{changes} changes, lag then {human_bytes(run['last_batch_lag_bytes'])}, "
                 f"{'?' if seconds is None else f'{seconds:.1f}'} s")
    return text


def checkpoint_rows(status: dict[str, Any], upto: str = "") -> list[tuple[str, str]]:
    """The ``checkpoint`` and ``last run`` rows of a pipeline's human output; *upto*
    follows the last committed batch (where it reached in the source's log)."""
    chk = status["checkpoint"]
    return [("checkpoint", f"{chk['path']}: " + (
                "no query has started" if chk["query_id"] is None else
                f"last committed batch {chk['last_committed_batch']}{upto}")),
            ("last run", run_line(status["last_run"])), *verify_rows(status)]
