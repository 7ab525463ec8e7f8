"""``tidemark status`` of a pipeline reading a MariaDB binlog: the server, the
checkpoint's position, the targets and the last run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidemark.pipeline.config import PipelineConfig
from tidemark.pipeline.status import _last_run, _run_line, _target
from tidemark.source.mariadb.position import BinlogPosition
from tidemark.spark_checkpoint import committed_source_offset
from tidemark.status.mariadb import position_findings, server_rows, server_section
from tidemark.status.report import Status, render, target_lines


def pipeline_status(config: PipelineConfig, config_file: str) -> Status:
    """A MariaDB pipeline's status: server, checkpoint position, targets, last run."""
    problems: list[str] = []
    warnings: list[str] = []
    server, files = server_section(config.dsn)
    query_id, committed, offset = committed_source_offset(config.checkpoint)
    checkpoint: dict[str, Any] = {"path": config.checkpoint, "query_id": query_id,
                                  "last_committed_batch": committed, "last_committed": None}
    position = None
    if offset is not None:
        position = BinlogPosition.from_offset(offset)
        checkpoint["last_committed"] = f"{position.file}:{position.pos}"
    if checkpoint["query_id"] is None:
        warnings.append("the pipeline has not started yet")
    targets = [_target(t, config.checkpoint, checkpoint["query_id"], problems)
               for t in config.targets]
    last_run = _last_run(config.checkpoint, problems)
    lag = position_findings(position, server, files, "checkpoint's", problems)
    return {"kind": "pipeline", "source": "mariadb", "healthy": not problems,
            "problems": problems, "warnings": warnings,
            "config": str(Path(config_file).resolve()), "server": server,
            "checkpoint": checkpoint, "targets": targets, "last_run": last_run, "lag": lag}


def render_pipeline(status: Status) -> str:
    rows = server_rows(status)
    chk = status["checkpoint"]
    rows.append(("checkpoint", f"{chk['path']}: " + (
        "no query has started" if chk["query_id"] is None else
        f"last committed batch {chk['last_committed_batch']} (up to {chk['last_committed']})")))
    rows.append(("last run", _run_line(status["last_run"])))
    return render(f"pipeline {status['config']}", rows, status,
                  target_lines(status["targets"]))
