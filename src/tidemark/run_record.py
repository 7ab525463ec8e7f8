"""How the last ``tidemark run`` of a checkpoint went, kept beside Spark's files.

Spark's checkpoint says which batches were committed, not when, nor why a query
stopped. The runner records that in ``<checkpoint>/tidemark-status.json`` (Spark ignores
files it does not know): when the run started and ended, how it ended (``running``
while it runs — also what a killed run leaves behind —, ``finished``, ``interrupted``,
``failed`` with the error's message), the running process (host and pid: whether a
``running`` record's process is still alive) and its last applied batch. ``tidemark
status`` and ``tidemark verify`` read it; failing to write it never fails the pipeline.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol, TypeVar

import msgspec

from tidemark.atomic_file import write_atomically

log = logging.getLogger(__name__)

#: The record's file in the checkpoint directory.
FILE_NAME: Final = "tidemark-status.json"

_MAX_ERROR_CHARS: Final = 4000
_lock = threading.Lock()  # the batch thread and the run's thread both write


class RunRecord(msgspec.Struct, kw_only=True):
    """The contents of the record (times in UTC)."""

    started_at: datetime.datetime | None = None
    ended_at: datetime.datetime | None = None
    outcome: str | None = None
    """``running``, ``finished``, ``interrupted`` or ``failed``."""
    error: str | None = None
    host: str | None = None
    """The host name of the machine the run's process runs on."""
    pid: int | None = None
    """The run's process id on :attr:`host`."""
    last_batch_id: int | None = None
    last_batch_at: datetime.datetime | None = None
    last_batch_changes: dict[str, int] | None = None
    last_batch_lag_bytes: int | None = None
    last_batch_lag_seconds: float | None = None
    upkeep: dict[str, str] | None = None
    """The last run of each upkeep task of each target (``"public.a compact"``), with
    when it ran and what it did."""


def read_record(checkpoint: str) -> RunRecord | None:
    """The record in *checkpoint*, None if there is none; raises ValueError if the file
    is not one."""
    file = Path(checkpoint) / FILE_NAME
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return msgspec.json.decode(data, type=RunRecord)
    except msgspec.DecodeError as err:
        raise ValueError(f"{file} is not tidemark's run record ({err})") from None


def may_be_running(checkpoint: str) -> bool:
    """Whether a ``tidemark run`` of *checkpoint* may be running now: its record says
    ``running`` and its process, where it ran on this host, is alive. A run on another
    host (or a record without a process) is taken as running: only its host can tell."""
    try:
        record = read_record(checkpoint)
    except (ValueError, OSError):
        return True
    if record is None or record.outcome != "running":
        return False
    if record.pid is None or record.host != socket.gethostname():
        return True
    return _alive(record.pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    try:  # Linux: a zombie (dead, not yet reaped by its parent) runs no more
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


class BatchReport(Protocol):
    """What the record keeps of an applied batch (the pipeline's
    :class:`~tidemark.pipeline.progress.BatchReport`)."""

    @property
    def batch_id(self) -> int: ...
    @property
    def changes(self) -> dict[str, int]: ...
    @property
    def lag_bytes(self) -> int: ...
    @property
    def lag_seconds(self) -> float: ...
    @property
    def upkeep(self) -> tuple[tuple[str, str, str], ...]: ...


def record_batch(checkpoint: str, report: BatchReport) -> None:
    """Note that *report*'s batch was applied."""
    now = _now()
    changes: dict[str, object] = {
        "last_batch_id": report.batch_id, "last_batch_at": now,
        "last_batch_changes": dict(report.changes), "last_batch_lag_bytes": report.lag_bytes,
        "last_batch_lag_seconds": report.lag_seconds}
    upkeep = {f"{table} {task}": f"{now.isoformat(timespec='seconds')}: {text}"
              for table, task, text in report.upkeep}
    _update(checkpoint, upkeep_done=upkeep, **changes)


class _Config(Protocol):
    @property
    def checkpoint(self) -> str: ...


class _Run(Protocol):
    @property
    def config(self) -> _Config: ...


R = TypeVar("R", bound=_Run)


def records_runs(run: Callable[[R], None]) -> Callable[[R], None]:
    """Decorate the body of ``Pipeline.run``: record its start, its end and how it ended."""

    @functools.wraps(run)
    def recorded(self: R) -> None:
        checkpoint = self.config.checkpoint
        _update(checkpoint, started_at=_now(), ended_at=None, outcome="running", error=None,
                host=socket.gethostname(), pid=os.getpid())
        try:
            run(self)
        except Exception as err:
            _update(checkpoint, ended_at=_now(), outcome="failed", error=_message(err))
            raise
        except BaseException:  # a second Ctrl-C: stopped at once, the batch replays
            _update(checkpoint, ended_at=_now(), outcome="interrupted")
            raise
        _update(checkpoint, ended_at=_now(), outcome="finished")

    return recorded


def _update(checkpoint: str, upkeep_done: dict[str, str] | None = None,
            **changes: object) -> None:
    file = Path(checkpoint) / FILE_NAME
    try:
        with _lock:
            try:
                record = read_record(checkpoint) or RunRecord()
            except ValueError:
                record = RunRecord()  # not ours or torn: start it over
            if upkeep_done:
                changes["upkeep"] = {**(record.upkeep or {}), **upkeep_done}
            record = msgspec.structs.replace(record, **changes)
            write_atomically(file, msgspec.json.encode(record))
    except OSError as err:
        log.warning("cannot record the run's status in %s: %s", file, err)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _message(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    if len(text) > _MAX_ERROR_CHARS:
        text = text[:_MAX_ERROR_CHARS] + "…"
    return text
