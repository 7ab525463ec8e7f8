"""``tidemark status`` of a pipeline reading a MariaDB binlog: the server, the
checkpoint's position, the targets and the last run."""

from __future__ import annotations

from tidemark.source.mariadb.position import BinlogPosition
from tidemark.status.mariadb import position_findings, server_rows, server_section
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
    """A MariaDB pipeline's status: server, checkpoint position, targets, last run."""
    problems: list[str] = []
    warnings: list[str] = []
    server, files = server_section(pipeline.dsn)
    checkpoint, offset = committed_checkpoint(pipeline.checkpoint, warnings)
    checkpoint["last_committed"] = None
    position = None
    if offset is not None:
        position = BinlogPosition.from_offset(offset)
        checkpoint["last_committed"] = f"{position.file}:{position.pos}"
    targets = target_sections(pipeline, checkpoint["query_id"], problems)
    last_run = last_run_section(pipeline.checkpoint, problems)
    lag = position_findings(position, server, files, "checkpoint's", problems)
    return {"kind": "pipeline", "source": "mariadb", "healthy": not problems,
            "problems": problems, "warnings": warnings, "config": pipeline.config,
            "server": server, "checkpoint": checkpoint, "targets": targets,
            "last_run": last_run,
            "last_verify": verify_section(pipeline.checkpoint), "lag": lag}


def render_pipeline(status: Status) -> str:
    """The human output of a MariaDB pipeline's status."""
    upto = f" (up to {status['checkpoint']['last_committed']})"
    rows = server_rows(status) + checkpoint_rows(status, upto)
    return render(f"pipeline {status['config']}", rows, status,
                  target_lines(status["targets"]))
