"""``tidemark status`` of a pipeline reading log tables: the log, the checkpoint's
positions in it, the targets and the last run."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tidemark.pipeline.config import PipelineConfig
from tidemark.pipeline.status import _last_run, _run_line, _target
from tidemark.source.logtable.database import Position
from tidemark.source.logtable.reader import open_database
from tidemark.spark_checkpoint import committed_source_offset
from tidemark.status.logtable import behind, log_rows, log_section
from tidemark.status.report import Status, render, target_lines


def pipeline_status(config: PipelineConfig, config_file: str) -> Status:
    """A log-table pipeline's status: the log, the checkpoint's positions, targets."""
    problems: list[str] = []
    warnings: list[str] = []
    query_id, committed, offset = committed_source_offset(config.checkpoint)
    checkpoint: dict[str, Any] = {"path": config.checkpoint, "query_id": query_id,
                                  "last_committed_batch": committed}
    positions: dict[int, Position] = {int(g): p for g, p in
                                      (offset or {}).get("groups", {}).items()}
    if checkpoint["query_id"] is None:
        warnings.append("the pipeline has not started yet")
    with contextlib.closing(open_database(config.dsn)) as db:
        log, tables = log_section(db, [t.table for t in config.targets], problems)
        lag = behind(db, tables, log["groups"], positions, "checkpoint's", warnings)
    targets = [_target(t, config.checkpoint, checkpoint["query_id"], problems)
               for t in config.targets]
    last_run = _last_run(config.checkpoint, problems)
    return {"kind": "pipeline", "source": "logtable", "healthy": not problems,
            "problems": problems, "warnings": warnings,
            "config": str(Path(config_file).resolve()), "log": log,
            "checkpoint": checkpoint, "targets": targets, "last_run": last_run, "lag": lag}


def render_pipeline(status: Status) -> str:
    rows = log_rows(status)
    chk = status["checkpoint"]
    rows.append(("checkpoint", f"{chk['path']}: " + (
        "no query has started" if chk["query_id"] is None else
        f"last committed batch {chk['last_committed_batch']}")))
    rows.append(("last run", _run_line(status["last_run"])))
    return render(f"pipeline {status['config']}", rows, status,
                  target_lines(status["targets"]))
