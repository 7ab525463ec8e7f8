"""The status of a ``tidemark run`` pipeline reading PostgreSQL's WAL, read without
starting Spark.

Everything comes from files and one database connection, so it takes well under a
second and can run while the pipeline runs: Spark's checkpoint (``metadata``: the query
id; ``offsets/N``: batch N's end, written before the batch runs; ``commits/N``: batch N
done), the slot on the server, and what every pipeline's status reads
(:mod:`tidemark.status.pipeline`: targets, last run). pyspark is not imported.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from tidemark import postgres_connection
from tidemark.errors import TidemarkError
from tidemark.source.postgres.pgoutput import lsn_to_str, str_to_lsn
from tidemark.source.postgres.slot_status import ServerWal, SlotState, read_server, read_slot
from tidemark.source.postgres.stream_offsets import SourceOffset
from tidemark.spark_checkpoint import last_batch
from tidemark.status.pipeline import (
    PipelineFacts,
    last_run_section,
    run_line,
    target_sections,
)
from tidemark.status.postgres import (
    lag_section,
    lsn,
    server_section,
    slot_findings,
    slot_lines,
    slot_section,
)
from tidemark.status.report import Status, merge_lines, render, table
from tidemark.status.verify_record import verify_rows, verify_section


def pipeline_status(pipeline: PipelineFacts) -> Status:
    """The status of *pipeline*."""
    problems: list[str] = []
    warnings: list[str] = []
    checkpoint = _checkpoint(pipeline.checkpoint, problems)
    # The last planned batch's whole offset (the snapshot's state), kept out of the JSON.
    offset: SourceOffset | None = checkpoint.pop("_offset", None)
    slot_name = pipeline.slot
    with contextlib.closing(postgres_connection.connect(pipeline.dsn,
                                            application_name="tidemark status")) as conn:
        server = read_server(conn)
        slot = read_slot(conn, slot_name, server)
    started = checkpoint["query_id"] is not None
    if slot is None and not started:
        warnings.append(f"replication slot {slot_name!r} does not exist yet: the pipeline "
                        "has not started (tidemark run creates it)")
    else:
        slot_findings(slot_name, slot, server, problems, warnings)
    _compare(checkpoint, slot, server, problems)
    targets = target_sections(pipeline, checkpoint["query_id"], problems)
    last_run = last_run_section(pipeline.checkpoint, problems)
    committed = (None if checkpoint["last_committed_lsn"] is None
                 else str_to_lsn(checkpoint["last_committed_lsn"]))
    return {
        "kind": "pipeline",
        "healthy": not problems,
        "problems": problems,
        "warnings": warnings,
        "config": pipeline.config,
        "server": server_section(server),
        "slot": slot_section(slot_name, slot, server),
        "lag": lag_section(slot, server, checkpoint_lsn=committed),
        "checkpoint": checkpoint,
        "targets": targets,
        "last_run": last_run,
            "last_verify": verify_section(pipeline.checkpoint),
        "snapshot": snapshot_section(pipeline, offset),
    }


def snapshot_section(pipeline: PipelineFacts, offset: SourceOffset | None
                     ) -> dict[str, Any]:
    """Which targets have been loaded, and the snapshot running now, from the last
    planned batch's offset."""
    section: dict[str, Any] = {"completed": None, "source": None, "incremental": None,
                               "running": None, "note": ""}
    wanted = [t.table for t in pipeline.targets if t.initial_snapshot]
    if offset is None:
        section["note"] = (f"not started: {', '.join(wanted)} will be loaded first"
                           if wanted else "none: every target has snapshot = never")
        return section
    section["source"] = "checkpoint"
    if offset.known is None:
        section["completed"] = True
        section["note"] = ("the checkpoint predates snapshots: the targets hold the changes "
                           "made since the slot was created")
        return section
    plan = offset.snapshot
    if plan is not None and not plan.done:
        section["completed"] = False
        section["running"] = {"generation": plan.generation, "at": lsn(plan.at),
                              "tables": list(plan.tables),
                              "table": plan.tables[plan.position],
                              "chunks_planned": plan.chunks_done}
        section["note"] = (f"running: {plan.progress(pipeline.snapshot_chunk_rows)} "
                           f"(snapshot at {lsn(plan.at)})")
        return section
    missing = [t for t in wanted if t not in offset.known
               and not (plan is not None and t in plan.tables)]
    section["completed"] = not missing
    section["note"] = (f"every target is loaded ({', '.join(wanted)} by a snapshot)"
                       if not missing and wanted else
                       "none: every target has snapshot = never" if not wanted else
                       f"{', '.join(missing)} will be loaded when the pipeline runs")
    return section


# -- Spark's checkpoint ------------------------------------------------------------------

def _checkpoint(path: str, problems: list[str]) -> dict[str, Any]:
    section: dict[str, Any] = {
        "path": path, "query_id": None, "last_offset_batch": None, "last_offset_lsn": None,
        "last_committed_batch": None, "last_committed_lsn": None, "batch_in_progress": False}
    root = Path(path)
    try:
        metadata = (root / "metadata").read_text(encoding="utf-8")
    except FileNotFoundError:
        return section  # the query never started
    except OSError as err:
        problems.append(f"cannot read the checkpoint {path}: {err.strerror or err}")
        return section
    try:
        # As the runner reads it (_checkpoint_query_id): one JSON object, first line.
        section["query_id"] = str(json.loads(metadata.splitlines()[0])["id"])
        offset_batch = last_batch(root / "offsets")
        committed_batch = last_batch(root / "commits")
        section["last_offset_batch"] = offset_batch
        section["last_committed_batch"] = committed_batch
        if offset_batch is not None:
            offset = _batch_offset(root, offset_batch)
            section["last_offset_lsn"] = lsn(None if offset is None else offset.lsn)
            section["_offset"] = offset
        if committed_batch is not None:
            section["last_committed_lsn"] = lsn(_batch_end(root, committed_batch))
        section["batch_in_progress"] = offset_batch is not None and (
            committed_batch is None or offset_batch > committed_batch)
    except (OSError, ValueError, KeyError, IndexError, TidemarkError) as err:
        problems.append(f"the checkpoint {path} is not one of a tidemark pipeline: {err}")
    return section


def _batch_end(root: Path, batch_id: int) -> int | None:
    """Batch *batch_id*'s end LSN."""
    offset = _batch_offset(root, batch_id)
    return None if offset is None else offset.lsn


def _batch_offset(root: Path, batch_id: int) -> SourceOffset | None:
    """Batch *batch_id*'s end offset: the last line of ``offsets/<batch_id>`` ("v1", the
    batch metadata, then one offset per source: this query has one)."""
    lines = (root / "offsets" / str(batch_id)).read_text(encoding="utf-8").splitlines()
    if lines[-1].strip() == "-":  # Spark's "no offset" for a source
        return None
    return SourceOffset.parse(json.loads(lines[-1]))


def _compare(checkpoint: dict[str, Any], slot: SlotState | None, server: ServerWal,
             problems: list[str]) -> None:
    """The checkpoint's positions against the server's WAL and the slot's."""
    committed = checkpoint["last_committed_lsn"]
    for key, what in (("last_offset_lsn", "last batch"),
                      ("last_committed_lsn", "last committed batch")):
        value = checkpoint[key]
        if (value is not None and server.end_lsn is not None
                and str_to_lsn(value) > server.end_lsn):
            problems.append(
                f"the checkpoint's {what} ends at {value}, ahead of this server's WAL "
                f"({lsn_to_str(server.end_lsn)}): the checkpoint belongs to another server; "
                "start over with a new checkpoint directory (and new targets)")
            return
    if (committed is not None and slot is not None and slot.confirmed_flush_lsn is not None
            and slot.confirmed_flush_lsn > str_to_lsn(committed)):
        problems.append(
            f"replication slot {slot.name!r} is at {lsn_to_str(slot.confirmed_flush_lsn)}, "
            f"past the checkpoint's last committed offset {committed}: it was advanced "
            "outside the pipeline, and the changes in between cannot be read again (the next "
            "batch fails); start over with a new checkpoint directory (and new targets)")


# -- human output ----------------------------------------------------------------------

def render_pipeline(status: Status) -> str:
    """The human output of a pipeline's status."""
    rows = slot_lines(status)
    chk = status["checkpoint"]
    if chk["query_id"] is None:
        rows.append(("checkpoint", f"{chk['path']}: no query has started"))
    else:
        committed = ("none committed" if chk["last_committed_batch"] is None else
                     f"last committed batch {chk['last_committed_batch']} (up to "
                     f"{chk['last_committed_lsn']})")
        progress = (f"; batch {chk['last_offset_batch']} in progress (up to "
                    f"{chk['last_offset_lsn']})" if chk["batch_in_progress"] else "")
        rows.append(("checkpoint", f"{chk['path']}: {committed}{progress}"))
    rows.append(("last run", run_line(status["last_run"])))
    rows += verify_rows(status)
    for task, text in sorted(((status["last_run"] or {}).get("upkeep") or {}).items()):
        rows.append((f"upkeep {task}", text))
    rows.append(("snapshot", status["snapshot"]["note"]))
    header = ("table", "delta version", "rows", "files", "checkpoint", "last batch",
              "last commit", "path")
    body: list[tuple[str, ...]] = []
    for t in status["targets"]:
        if t["lost"]:
            body.append((t["table"], "LOST", "-", "-", "-", "-", "-", t["path"]))
            continue
        if not t["exists"]:
            body.append((t["table"], "not created yet", "-", "-", "-", "-", "-", t["path"]))
            continue
        body.append(tuple("-" if v is None else str(v) for v in (
            t["table"], t["delta_version"], t["rows"], t["files"], t["checkpoint_version"],
            t["last_batch_id"], t["last_commit_at"], t["path"])))
    lines = ["targets:", *table(header, body), *merge_lines(status["targets"])]
    return render(f"pipeline {status['config']}", rows, status, lines)
