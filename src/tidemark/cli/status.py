"""``tidemark status``: where a capture or a pipeline stands, and whether it is healthy."""

from __future__ import annotations

import importlib
import json
import sys
from types import ModuleType
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from tidemark.pipeline.config import PipelineConfig
    from tidemark.status.pipeline import PipelineFacts
    from tidemark.status.report import Status


def pipeline_facts(config: PipelineConfig, config_file: str) -> PipelineFacts:
    """What a pipeline's status reads of its file *config_file* (loaded as *config*)."""
    from tidemark.spark.options import SnapshotMode  # noqa: PLC0415
    from tidemark.status.pipeline import PipelineFacts, PipelineTarget  # noqa: PLC0415

    return PipelineFacts(
        config_file=config_file, dsn=config.dsn, slot=config.source.slot,
        checkpoint=config.checkpoint,
        targets=tuple(PipelineTarget(table=t.table, path=t.path,
                                     storage_options=t.storage_options, local=t.local,
                                     initial_snapshot=t.snapshot is SnapshotMode.INITIAL,
                                     merge=t.spec.merge)
                      for t in config.targets),
        snapshot_chunk_rows=config.source.chunk_rows)


def pipeline_status(config: PipelineConfig, config_file: str) -> Status:
    """The status of the pipeline *config* (loaded from *config_file*), from its
    source's status module."""
    status: Status = _pipeline_module(config).pipeline_status(
        pipeline_facts(config, config_file))
    return status


def _pipeline_module(config: PipelineConfig) -> ModuleType:
    """The status module of the pipeline's source kind."""
    from tidemark.source.registry import kind_of  # noqa: PLC0415

    return importlib.import_module(
        kind_of(config.dsn, config.source.kind).status_modules().pipeline)


@click.command()
@click.argument("config_file", required=False, type=click.Path(dir_okay=False))
@click.option("--dsn", envvar="TIDEMARK_DSN",
              help="A capture's database: libpq connection string or URI, a mariadb:// "
                   "URL or a sqlite: file (or $TIDEMARK_DSN). A pipeline's comes from its "
                   "file.")
@click.option("--slot", default="tidemark", show_default=True,
              help="A capture's replication slot (capture's --slot).")
@click.option("--offsets", type=click.Path(dir_okay=False),
              help="A capture's offsets file (capture's --offsets): compared with the slot.")
@click.option("--source", default=None, metavar="KIND",
              help="A PostgreSQL capture of log tables (capture's --source); a sqlite: DSN "
                   "is always one.")
@click.option("--topic-prefix", default="tidemark", show_default=True,
              help="A log-table capture's --topic-prefix (its offsets' keys start with it).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (keys below) instead of text.")
@click.pass_context
def status(ctx: click.Context, config_file: str | None, dsn: str | None, slot: str,
           offsets: str | None, source: str | None, topic_prefix: str,
           as_json: bool) -> None:
    """Show a capture's slot and offsets, or a pipeline's (CONFIG_FILE) targets,
    checkpoint and slot. Read-only, and Spark is not started.

    Exit status: 0 healthy, 1 something is wrong (listed under "problems": a missing or
    invalidated slot, an offset ahead of the server, a lost target, a failed last run),
    2 the status could not be taken (usage, config, connection).

    \b
    JSON keys (all always present; null = not measured; LSNs "16/B374D848",
    sizes in bytes, times ISO 8601 UTC):
      kind, healthy, problems[], warnings[]
      server   {database, version_num, in_recovery, end_lsn, current_lsn}
      slot     {name, exists, type, plugin, database, temporary, active, active_pid,
                holder_application, holder_backend_type, holder_client_addr,
                restart_lsn, confirmed_flush_lsn, wal_status, safe_wal_size_bytes,
                wal_retained_bytes}
      lag      {from, from_lsn, bytes, seconds, seconds_source, note}
      snapshot {completed, source, incremental, note}
      capture:  offsets {file, key, exists, found, lsn, snapshot_completed, keys,
                         state, bytes_vs_slot, meaning}  (null without --offsets)
      pipeline: config, checkpoint {path, query_id, last_offset_batch,
                last_offset_lsn, last_committed_batch, last_committed_lsn,
                batch_in_progress}, targets [{table, path, exists, lost,
                delta_version, rows, files, checkpoint_version, app_id,
                last_batch_id, last_commit_at, merge, deletion_vector_files,
                deleted_rows, deleted_fraction, problem}], last_run {started_at,
                ended_at, outcome, error, last_batch_id, last_batch_at,
                last_batch_changes, last_batch_lag_bytes, last_batch_lag_seconds,
                upkeep} (null if none)
      A MariaDB source (mariadb:// DSN) has no slot: source "mariadb",
      server {host, version, binlog_file, binlog_pos, gtids, oldest_binlog, binlogs},
      lag {bytes, files_behind, note}, and capture: offsets {file, exists, found,
      position, gtids}, or pipeline: checkpoint {path, query_id, last_committed_batch,
      last_committed}, targets, last_run; a purged binlog is a problem.
      A log-table source (sqlite: DSN, --source logtable, [source] kind = "logtable"):
      source "logtable", log {connector, database, generations[], groups, tables[]},
      lag {changes, groups_read, groups_unread, note} (logged changes not read yet),
      and capture: offsets {file, exists, groups}, or pipeline: checkpoint {path,
      query_id, last_committed_batch}, targets, last_run; a missing or out-of-step log
      table is a problem.
    """
    # Imported here: `tidemark capture` must not pay for pyarrow and deltalake.
    import psycopg  # noqa: PLC0415

    from tidemark.errors import SourceError  # noqa: PLC0415

    try:
        if config_file is not None:
            for name in ("dsn", "slot", "offsets", "source", "topic_prefix"):
                if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
                    raise click.UsageError(f"--{name} is for a capture's status; a "
                                           "pipeline's comes from CONFIG_FILE")
            from tidemark.pipeline.config import load_config  # noqa: PLC0415

            config = load_config(config_file)
            module = _pipeline_module(config)
            result = module.pipeline_status(pipeline_facts(config, config_file))
            text = module.render_pipeline
        else:
            if not dsn:
                raise click.UsageError("give --dsn (or set TIDEMARK_DSN) for a capture's "
                                       "status, or a pipeline file")
            from tidemark.source.registry import kind_of  # noqa: PLC0415

            module = importlib.import_module(kind_of(dsn, source).status_modules().capture)
            result = module.status_of_capture(dsn, slot=slot, offsets=offsets,
                                              topic_prefix=topic_prefix)
            text = module.render_capture
    except psycopg.Error as err:
        message = (err.diag.message_primary or str(err)).strip().splitlines()
        raise SourceError(f"cannot read the slot's state: "
                          f"{message[0] if message else type(err).__name__}") from None
    click.echo(json.dumps(result, indent=2) if as_json else text(result))
    if not result["healthy"]:
        sys.exit(1)
