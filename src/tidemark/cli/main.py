"""The ``tidemark`` command."""

from __future__ import annotations

import sys

import click

from tidemark import __version__
from tidemark.cli import logs
from tidemark.cli.capture import capture
from tidemark.cli.demo import demo
from tidemark.cli.logtable import logtable
from tidemark.cli.pipelines import pipelines
from tidemark.cli.run import run
from tidemark.cli.signal import signal
from tidemark.cli.status import status
from tidemark.errors import TidemarkError


@click.group()
@click.version_option(__version__, prog_name="tidemark")
@click.option("--log-level", default="WARNING", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Level of tidemark's logs (to stderr; other libraries log warnings and "
                   "errors only).")
def cli(log_level: str) -> None:
    """tidemark: change data capture for Python and Apache Spark."""
    logs.configure(log_level)


cli.add_command(capture)
cli.add_command(demo)
cli.add_command(logtable)
cli.add_command(pipelines)
cli.add_command(run)
cli.add_command(signal)
cli.add_command(status)


def main() -> None:
    """Entry point: run the CLI, turning tidemark errors into one clear line and exit 2."""
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except TidemarkError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)
