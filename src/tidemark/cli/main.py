"""The ``tidemark`` command."""

from __future__ import annotations

import importlib
import sys
from typing import Final

import click

from tidemark import __version__
from tidemark.cli import logs
from tidemark.errors import TidemarkError

#: The subcommands: each is the function of its name in ``tidemark.cli.<name>``, imported
#: when it runs (a MariaDB capture does not pay for the PostgreSQL driver, nor a status
#: for Spark).
_COMMANDS: Final = ("capture", "demo", "logtable", "pipelines", "run", "signal", "status",
                           "verify")


class _Subcommands(click.Group):
    """The subcommands of :data:`_COMMANDS`, imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None
        command: click.Command = getattr(importlib.import_module(f"tidemark.cli.{cmd_name}"),
                                         cmd_name)
        return command


@click.group(cls=_Subcommands)
@click.version_option(__version__, prog_name="tidemark")
@click.option("--log-level", default="WARNING", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Level of tidemark's logs (to stderr; other libraries log warnings and "
                   "errors only).")
def cli(log_level: str) -> None:
    """tidemark: change data capture for Python and Apache Spark."""
    logs.configure(log_level)



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
