"""``tidemark verify``: prove that a pipeline's Delta targets equal their source tables."""

from __future__ import annotations

import sys

import click

from tidemark.verify import DEFAULT_REPAIR_LIMIT


@click.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--table", "tables", multiple=True, metavar="SCHEMA.TABLE",
              help="Verify only this target (repeatable). Default: every target.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=120.0,
              show_default=True, metavar="SECONDS",
              help="How long to wait for the pipeline to commit the source's current "
                   "position; a pipeline that does not is compared as it is, its "
                   "differences marked 'target behind'.")
@click.option("--repair", is_flag=True,
              help="Send the differing keys to the running pipeline (through its "
                   "[source] signal_table) to re-read from the source, wait (--wait) "
                   "until it has applied them and verify those tables again.")
@click.option("--repair-limit", type=click.IntRange(min=1), default=DEFAULT_REPAIR_LIMIT,
              show_default=True, metavar="KEYS",
              help="Refuse to repair a table with more differing keys than this "
                   "(reload it with tidemark signal execute-snapshot instead).")
def verify(config: str, tables: tuple[str, ...], as_json: bool, wait_s: float,
           repair: bool, repair_limit: int) -> None:
    """Compare each target of the pipeline file CONFIG with its source table.

    Both sides checksum their rows where the data is (the source database in SQL, the
    Delta table with DuckDB) at one source position; only the rows of differing
    buckets are read. Each differing key is printed as missing (in the source, not the
    target), extra (in the target, not the source) or different (with the columns).
    The result is kept in the checkpoint (verify.json) for `tidemark status`.

    With --repair, the differing keys are re-read from the source by the running
    pipeline, and the repaired tables verified again once it has applied them; a
    pipeline that is not running applies them at its next start.

    Exit status: 0 every target equals its source (after --repair: again), 1
    differences, 2 an error.
    """
    from tidemark.verify.report import json_report, text_report  # noqa: PLC0415
    from tidemark.verify.run import verify as run  # noqa: PLC0415 - DuckDB, Delta

    result = run(config, tables or None, wait_s, repair=repair, repair_limit=repair_limit)
    if as_json:
        click.echo(json_report(result))
    else:
        for line in text_report(result):
            click.echo(line, err=result.error is not None)
    sys.exit(result.exit_code)
