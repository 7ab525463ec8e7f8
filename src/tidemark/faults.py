"""Crash injection for the exactly-once tests: ``TIDEMARK_FAULT=<point>:<n>``.

Exactly once must survive a driver dying at any moment; the tests prove it at the
moments that decide it, by SIGKILL at a named point of the pipeline:

* ``after_read:n`` — batch *n* has been read from the source (and cached), nothing of it
  is in Delta yet;
* ``between_steps:n`` — batch *n* was too big to collect and is being applied in steps:
  its first steps are merged into a branch of a target, which holds the rest back from
  readers (:mod:`tidemark.lake.branch`), nothing of it is committed to Delta;
* ``between_targets:n`` — batch *n* is in the first Delta target it has changes for
  (in the pipeline file's order), not yet in the others;
* ``after_write:n`` — batch *n* is in every Delta target, Spark has not written it to
  the checkpoint's commit log yet;
* ``before_advance:n`` — Spark has committed a batch, the source's ``commit()`` has not
  advanced the slot yet. *n* counts this process's ``commit()`` calls from 0: Spark
  calls it once per batch, in order, when it plans the next batch (on a fresh
  checkpoint call *n* is batch *n*'s).
* ``after_slot_created:0`` — a slot was just made and where it starts is not saved yet:
  capture or the engine replaced a lost slot (or made one for a new snapshot while
  offsets of an earlier slot exist), or a new Spark query made its slot.
* ``mor_after_vectors:n`` — a merge-on-read batch (:mod:`tidemark.lake.merge_on_read`)
  whose app-transaction version is *n* (in ``tidemark run``: batch *n*) has written its
  deletion-vector file into the target, its new data files are still in the scratch
  table, nothing of it is committed;
* ``mor_after_files:n`` — that batch's new data files are moved into the target, its
  Delta commit is not written;
* ``mor_after_commit:n`` — that batch's Delta commit is written (with its app
  transaction), :func:`~tidemark.lake.merge_on_read.merge_on_read` has not returned:
  Spark has not recorded the batch.

Off unless the variable is set (a check is a cached lookup and a comparison). When it fires it
kills the whole process group, not just the process it runs in: ``commit()`` runs in the
Python process Spark starts for the source, and a driver crash takes the Python driver,
its JVM and that process down together. It also kills the group that leads the process's
session: Spark's Python workers (where ``apply_on = "executors"`` merges) run in a group
of their own (PySpark's daemon makes one), and the crash meant is the driver's. So a
pipeline run with this set must lead its own session (``start_new_session=True``), or
it kills its caller too.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from typing import Final

log = logging.getLogger(__name__)

ENV: Final = "TIDEMARK_FAULT"
POINTS: Final = ("after_read", "between_steps", "between_targets", "after_write",
                  "before_advance", "after_slot_created", "mor_after_vectors",
                  "mor_after_files", "mor_after_commit")


@functools.cache
def _armed() -> tuple[str, int] | None:
    spec = os.environ.get(ENV, "")
    if not spec:
        return None
    point, _, number = spec.partition(":")
    if point not in POINTS or not number.isdigit():
        raise ValueError(f"{ENV}={spec!r}: expected <point>:<n>, the point one of "
                         f"{', '.join(POINTS)} and n a batch number")
    return point, int(number)


def crash_point(point: str, n: int) -> None:
    """SIGKILL this process group and the session leader's if :data:`ENV` names *point*
    and *n*."""
    if _armed() == (point, n):
        log.warning("%s=%s:%d: killing the process group", ENV, point, n)
        # The session leader's group first: killing our own group ends this process.
        if os.getsid(0) != os.getpgrp():
            os.killpg(os.getsid(0), signal.SIGKILL)
        os.killpg(os.getpgrp(), signal.SIGKILL)
