"""``tidemark status`` of a pipeline reading log tables: the log, the checkpoint's
positions in it, the targets and the last run."""

from __future__ import annotations

import contextlib

from tidemark.source.logtable.database import Position
from tidemark.source.logtable.reader import open_database
from tidemark.status.logtable import behind, log_rows, log_section
from tidemark.status.pipeline import (
    PipelineFacts,
    checkpoint_rows,
    committed_checkpoint,
    last_run_section,
    target_sections,
)
from tidemark.status.report import Status, render, target_lines
from tidemark.status.verify_record import verify_section


def pipeline_status(pipeline: PipelineFacts) -> Status:
    """A log-table pipeline's status: the log, the checkpoint's positions, targets."""
    problems: list[str] = []
    warnings: list[str] = []
    checkpoint, offset = committed_checkpoint(pipeline.checkpoint, warnings)
    positions: dict[int, Position] = {int(g): p for g, p in
                                      (offset or {}).get("groups", {}).items()}
    with contextlib.closing(open_database(pipeline.dsn)) as db:
        log, tables = log_section(db, [t.table for t in pipeline.targets], problems)
        lag = behind(db, tables, log["groups"], positions, "checkpoint's", warnings)
    targets = target_sections(pipeline, checkpoint["query_id"], problems)
    last_run = last_run_section(pipeline.checkpoint, problems)
    return {"kind": "pipeline", "source": "logtable", "healthy": not problems,
            "problems": problems, "warnings": warnings, "config": pipeline.config,
            "log": log, "checkpoint": checkpoint, "targets": targets, "last_run": last_run,
            "last_verify": verify_section(pipeline.checkpoint),
            "lag": lag}


def render_pipeline(status: Status) -> str:
    """The human output of a log-table pipeline's status."""
    rows = log_rows(status) + checkpoint_rows(status)
    return render(f"pipeline {status['config']}", rows, status,
                  target_lines(status["targets"]))
