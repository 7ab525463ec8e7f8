"""Upkeep's file rewrites beside the batches: :func:`start` and :func:`finish`.

Rewriting a merge-on-read target's files without their deleted rows
(:mod:`tidemark.lake.vector_compaction`) reads and writes whole files: a 16 MB file
took 0.2-0.4 s, a bigger one longer, and when upkeep ran it between two batches the
next batch waited that long (in a 10M-row soak at 10,000 uniform changes/s, upkeep's p99
was 0.42 s of a batch cycle whose p50 was 0.44 s). Here the reading and writing run on
a thread of their own (:data:`REWRITER`) while the pipeline applies its next batches;
the commit, which takes milliseconds, is made by upkeep between two batches once they
are done. The target's one writer stays the only committer: a batch and a rewrite
commit never race.

Batches keep deleting rows of the files being rewritten meanwhile: the commit marks
them in the new files' deletion vectors (the rows keep their order, so their new
positions follow from the vectors the rewrite read), and the writer's key index takes
the rows over as it does for a rewrite between batches (:mod:`tidemark.lake.relocations`).
A file a batch dropped whole, or any error, abandons the rewrite; its files, in no
version, are deleted (a pipeline that stops with one running leaves its files to
vacuum), and upkeep's next rewrite runs between two batches. A partitioned table's
rewrites always do: its rows are written in no known order.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from pathlib import Path
from typing import Final

from tidemark.lake import delta_log
from tidemark.lake.vector_compaction import (
    PreparedRewrite,
    RewritePlan,
    VectorCompaction,
    commit_rewrite,
    prepare_rewrite,
)

log = logging.getLogger(__name__)

#: One thread for every target's rewrites: on two cores a second one would only take
#: more of the batches' CPU.
REWRITER: Final = concurrent.futures.ThreadPoolExecutor(
    max_workers=1, thread_name_prefix="tidemark-rewrite")


@dataclasses.dataclass
class PendingRewrite:
    """A rewrite whose files are being written: the upkeep task it is (``name``, and
    ``what`` it does for the log), when it was started, its future, and how long the
    thread took to write its files (0 until it has)."""

    name: str
    what: str
    started: float
    future: concurrent.futures.Future[PreparedRewrite] = dataclasses.field(init=False)
    seconds: float = 0.0

    def done(self) -> bool:
        """Whether its files are written (or it failed): :func:`finish` will not wait."""
        return self.future.done()


def start(root: Path, plan: RewritePlan, name: str, what: str) -> PendingRewrite:
    """Start writing the files of *plan* for the local table *root* beside the batches."""
    pending = PendingRewrite(name, what, time.monotonic())

    def write() -> PreparedRewrite:
        # Timed here, not from the submit: the thread may first finish a checkpoint.
        began = time.monotonic()
        try:
            return prepare_rewrite(root, plan)
        finally:
            pending.seconds = time.monotonic() - began

    pending.future = REWRITER.submit(write)
    return pending


def finish(root: Path, pending: PendingRewrite,
           state: delta_log.LogState) -> VectorCompaction | None:
    """Commit *pending* (waiting for its files if need be) as the version after
    *state*, the table's latest; None when it was abandoned (a file it rewrote is gone,
    another writer committed first, or writing failed: logged)."""
    try:
        prepared = pending.future.result()
    except Exception as err:
        log.warning("%s: %s failed (the table is unchanged; upkeep tries again later): %s",
                    root, pending.what, err)
        return None
    try:
        done = commit_rewrite(root, prepared, state)
    except delta_log.CommitConflictError as err:
        log.info("%s: %s skipped: %s", root, pending.what, err)
        return None
    except Exception as err:
        log.warning("%s: %s failed (the table is unchanged; upkeep tries again later): %s",
                    root, pending.what, err)
        return None
    if done is None:
        log.info("%s: %s abandoned: a file it rewrote is no longer live, or the rows "
                 "deleted from it meanwhile could not be placed; the next runs between "
                 "two batches", root, pending.what)
    return done

