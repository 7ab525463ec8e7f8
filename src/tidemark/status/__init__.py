"""``tidemark status``: where a capture or a pipeline stands, and whether that is healthy.

A status is one JSON-able dict with stable keys (every key is always present; what was
not measured is ``null``, never a guess). The human output is rendered from the same
dict, so both say the same. Each source kind names its two status modules
(:meth:`tidemark.source.kind.SourceKind.status_modules`): a capture's and a pipeline's.
:mod:`tidemark.status.report` holds what every status shares (rendering),
:mod:`tidemark.status.pipeline` what every pipeline's status shares (the Delta targets,
the last run, the checkpoint's last committed batch); the sources' are
:mod:`~tidemark.status.postgres` (server, slot, lag; a capture's slot and offsets file)
and :mod:`~tidemark.status.postgres_pipeline` (Spark checkpoint against the slot),
:mod:`~tidemark.status.mariadb` and :mod:`~tidemark.status.mariadb_pipeline`,
:mod:`~tidemark.status.logtable` and :mod:`~tidemark.status.logtable_pipeline`. The keys
below are PostgreSQL's; ``tidemark status --help`` lists the other sources'.

Keys (``--json``)::

    kind             "capture" | "pipeline"
    healthy          false when problems is not empty (exit 1)
    problems         list of sentences: what is broken and what it means
    warnings         list of sentences: worth a look, not broken
    server           {database, version_num, in_recovery, end_lsn, current_lsn}
    slot             {name, exists, type, plugin, database, temporary, active,
                      active_pid, holder_application, holder_backend_type,
                      holder_client_addr, restart_lsn, confirmed_flush_lsn,
                      wal_status, safe_wal_size_bytes, wal_retained_bytes}
    lag              {from, from_lsn, bytes, seconds, seconds_source, note}
    snapshot         {completed, source, incremental, note}

    capture only:
    offsets          null without --offsets, else {file, key, exists, found, lsn,
                      snapshot_completed, keys, state, bytes_vs_slot, meaning}

    pipeline only:
    config           the pipeline file
    checkpoint       {path, query_id, last_offset_batch, last_offset_lsn,
                      last_committed_batch, last_committed_lsn, batch_in_progress}
    targets          [{table, path, exists, lost, delta_version, rows, files,
                       checkpoint_version, app_id, last_batch_id, last_commit_at,
                       problem}]
    last_run         null if no run recorded it, else {started_at, ended_at, outcome,
                      error, last_batch_id, last_batch_at, last_batch_changes,
                      last_batch_lag_bytes, last_batch_lag_seconds, upkeep}
                      (upkeep: "<table> <task>" -> when the task last ran and what
                      it did)

LSNs are PostgreSQL's text form (``"16/B374D848"``), sizes bytes, times ISO 8601 UTC.
``offsets.state`` is one of ``in_step``, ``behind_slot``, ``ahead_of_slot``,
``ahead_of_server``, ``no_slot``, ``no_key``, ``no_file``, ``invalid``;
``lag.from`` is ``slot`` (a capture: the slot's confirmed position) or ``checkpoint`` (a
pipeline: the end of its last committed batch; the slot follows when the next batch
starts); ``lag.seconds_source`` one of ``walsender_flush_lag``, ``walsender_replay_lag``,
``walsender_write_lag``, ``caught_up`` or null (unknown, ``note`` says why);
``snapshot.incremental`` is null unless the saved offset holds an incremental snapshot in
progress: then ``{tables, paused, current, last_key, max_key}`` (tables left, the current
one first, and how far its chunks have come in key order).
"""
