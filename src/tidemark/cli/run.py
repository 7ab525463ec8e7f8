"""``tidemark run pipeline.toml``: run a pipeline until stopped (or caught up)."""

from __future__ import annotations

import signal
import sys
import types

import click


@click.command()
@click.argument("config_file", type=click.Path(dir_okay=False))
@click.option("--available-now", is_flag=True,
              help="Read what the source has flushed now, apply it, then exit "
                   "(overrides the file's trigger).")
def run(config_file: str, available_now: bool) -> None:
    """Run the pipeline in CONFIG_FILE (TOML): PostgreSQL changes into Delta tables.

    Ctrl-C (or SIGTERM) stops after the batch in progress (exit 130 after Ctrl-C, 0
    after SIGTERM); a second one stops at once (the batch in progress replays).
    """
    # Imported here, not at the top: the pipeline pulls in pyarrow and deltalake (~0.7 s
    # and ~100 MB), which every other command (`tidemark capture` above all) must not pay.
    from tidemark.pipeline.config import load_config  # noqa: PLC0415
    from tidemark.pipeline.progress import BatchReport, format_report  # noqa: PLC0415

    config = load_config(config_file)  # every config error before Spark starts
    if available_now:
        config = config.with_available_now()
    # Imported after validation: pyspark takes a second to import.
    from tidemark.pipeline.runner import Pipeline  # noqa: PLC0415

    def show(report: BatchReport) -> None:
        click.echo(format_report(report))

    pipeline = Pipeline(config, on_batch=show)
    stopped_by: list[int] = []

    def on_signal(signum: int, frame: types.FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not stopped_by:
            stopped_by.append(signum)
            click.echo(f"{name}: stopping after the current batch (again to stop at once)",
                       err=True)
            pipeline.request_stop()
        elif not pipeline.streaming:
            raise KeyboardInterrupt  # no batch runs yet that the interrupt could cut short
        else:
            # Not KeyboardInterrupt: the process must not end while a batch still runs
            # in py4j's thread; the pipeline stops the query and waits for it to return.
            click.echo(f"{name}: stopping now (the batch in progress replays on the next "
                       "start)", err=True)
            pipeline.request_stop(now=True)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    mode = "until caught up" if config.spark.available_now else "until Ctrl-C"
    click.echo(f"tidemark run: {', '.join(config.tables)} -> "
               f"{len(config.targets)} Delta table(s), {mode}", err=True)
    pipeline.run()
    click.echo("stopped", err=True)
    if stopped_by and stopped_by[0] == signal.SIGINT:
        # A shell and a script tell an interrupted run by 128 + SIGINT; SIGTERM is how
        # service managers stop a service, which they count as clean with exit 0.
        sys.exit(128 + signal.SIGINT)
