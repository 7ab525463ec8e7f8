"""``tidemark signal``: write a Debezium signal into a capture's signal table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from tidemark.source.signals import SignalError, execute_snapshot_data, send_signal

_F = TypeVar("_F", bound=Callable[..., Any])


def _target(func: _F) -> _F:
    """The options every subcommand shares: where to write the signal, and its id."""
    func = click.option("--id", "signal_id",
                        help="The signal's id (at most 42 characters). Default: a random "
                             "one.")(func)
    func = click.option("--signal-table", required=True, metavar="SCHEMA.TABLE",
                        help="The signal table the capture reads (its --signal-table).")(func)
    return click.option("--dsn", envvar="TIDEMARK_DSN", required=True,
                        help="libpq connection string or URI (or $TIDEMARK_DSN, to keep "
                             "secrets out of the process list).")(func)


def _send(dsn: str, signal_table: str, signal_type: str, data: dict[str, Any] | None,
          signal_id: str | None) -> None:
    click.echo(send_signal(dsn, signal_table, signal_type, data, signal_id=signal_id))


@click.group()
def signal() -> None:
    """Send a signal to a running capture: write a row into its signal table.

    The row is Debezium's (id, type, data), so the capture reads it as Debezium would.
    The signal is checked before it is written; the signal's id is printed.
    """


@signal.command("execute-snapshot")
@click.argument("tables", nargs=-1, required=True, metavar="TABLE...")
@click.option("--condition", "conditions", multiple=True, metavar="TABLE=FILTER",
              help="Snapshot only the rows of TABLE for which the SQL condition FILTER "
                   "holds (repeatable, one per table).")
@click.option("--surrogate-key", metavar="COLUMN",
              help="Read the tables in the order of this column instead of their primary "
                   "key.")
@_target
def execute_snapshot(tables: tuple[str, ...], conditions: tuple[str, ...],
                     surrogate_key: str | None, dsn: str, signal_table: str,
                     signal_id: str | None) -> None:
    """Snapshot tables incrementally while the stream keeps flowing.

    TABLE is schema.table (or table, in schema public); the tables are read one after
    the other, in the order given.
    """
    filters: dict[str, str] = {}
    for item in conditions:
        table, equals, condition = item.partition("=")
        if not equals:
            raise SignalError(f"--condition {item!r}: expected TABLE=FILTER, e.g. "
                              "--condition \"public.orders=status = 'open'\"")
        table = table.strip()  # "public.orders = x" is CLI spacing, not part of the name
        if table in filters:
            raise SignalError(f"--condition is given twice for {table}: give one condition "
                              "per table (combine them with AND)")
        filters[table] = condition
    _send(dsn, signal_table, "execute-snapshot",
          execute_snapshot_data(tables, filters, surrogate_key), signal_id)


@signal.command("stop-snapshot")
@click.argument("tables", nargs=-1, metavar="[TABLE...]")
@_target
def stop_snapshot(tables: tuple[str, ...], dsn: str, signal_table: str,
                  signal_id: str | None) -> None:
    """Stop the incremental snapshot of some tables, or of all.

    With no TABLE, the whole snapshot is stopped.
    """
    data: dict[str, Any] = {"type": "incremental"}
    if tables:
        data["data-collections"] = list(tables)
    _send(dsn, signal_table, "stop-snapshot", data, signal_id)


@signal.command("pause-snapshot")
@_target
def pause_snapshot(dsn: str, signal_table: str, signal_id: str | None) -> None:
    """Pause the incremental snapshot (the stream goes on)."""
    _send(dsn, signal_table, "pause-snapshot", None, signal_id)


@signal.command("resume-snapshot")
@_target
def resume_snapshot(dsn: str, signal_table: str, signal_id: str | None) -> None:
    """Resume a paused incremental snapshot."""
    _send(dsn, signal_table, "resume-snapshot", None, signal_id)


@signal.command("log")
@click.argument("message")
@_target
def log(message: str, dsn: str, signal_table: str, signal_id: str | None) -> None:
    """Have the capture write MESSAGE to its log (when it reads the signal)."""
    _send(dsn, signal_table, "log", {"message": message}, signal_id)
