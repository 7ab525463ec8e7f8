"""The columns of the conformance matrix: one :class:`Runtime` per way to run a source.

A runtime is opened on a source (:meth:`Runtime.open`) and gives a :class:`Running`
whose :meth:`Running.rows` are the rows its output says the table holds: the change
events it delivered, decoded from the runtime's own format (JSON lines, Avro, Arrow,
Spark rows) and replayed, or, for ``tidemark run``, the Delta table itself.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from conformance.sources import Rows, SourceUnderTest, canon_rows
from conformance.type_columns import from_batch, from_debezium, from_text, time_millis
from tidemark.lake.debezium_input import PLACEHOLDER, changes_from_debezium_json

ChangeRow = dict[str, Any]
_META = ("_op", "_lsn", "_commit_lsn", "_seq", "_commit_ts", "_txid", "_unavailable")


def replay(changes: list[ChangeRow], names: list[str]) -> Rows:
    """The rows *changes* leave (in order per key; a column the change did not carry,
    named in ``_unavailable``, keeps its value)."""
    state: Rows = {}
    for change in changes:
        key = change["id"]
        if change["_op"] == "d":
            state.pop(key, None)
            continue
        if change["_op"] not in ("c", "u", "r"):
            continue
        skip = set(change.get("_unavailable") or ())
        row = dict(state.get(key, {}))
        row.update({n: change[n] for n in names if n not in skip})
        state[key] = row
    return canon_rows(state)


def from_json_values(values: list[Any], source: SourceUnderTest) -> list[ChangeRow]:
    """Debezium JSON envelope values (text, or dicts) as change rows."""
    envelopes = []
    for number, value in enumerate(values):
        envelope = json.loads(value) if isinstance(value, (str, bytes)) else value
        if not isinstance(envelope, dict):
            continue
        time_millis(envelope, source.arrow_schema())
        # Replayed in delivery order (a key's changes come in order on every source):
        # an order for the decoder where the source block has none (log tables).
        if not (envelope.get("transaction") or {}).get("commit_lsn"):
            envelope["transaction"] = {"commit_lsn": 1, "total_order": number + 1}
        envelopes.append(envelope)
    if not envelopes:
        return []
    types = source.types if source.typed else None
    return [from_debezium(row, types) for row in
            changes_from_debezium_json(envelopes, source.arrow_schema()).to_pylist()]


class Running:
    """A runtime running on a source."""

    def __init__(self, source: SourceUnderTest) -> None:
        self.source = source

    def changes(self) -> list[ChangeRow]:
        """What the runtime delivered so far, as change rows, in delivery order."""
        raise NotImplementedError

    def rows(self) -> Rows:
        return replay(self.changes(), self.source.names)

    def close(self) -> None:
        """Stop the runtime the way a user does."""

    def kill(self) -> None:
        """SIGKILL the runtime's process."""
        raise NotImplementedError


class Runtime:
    """One column of the matrix."""

    name = ""
    #: Why this runtime cannot be SIGKILLed on its own (None: it can).
    kill_refusal: str | None = None

    def open(self, source: SourceUnderTest, where: Path, **settings: Any) -> Running:
        """Start it on *source*, keeping its state (offsets, checkpoint) in *where*;
        *settings* are the source connector's."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


class _ChildRunning(Running):
    """A runtime in a process of its own (``process``), writing its output to ``out``."""

    process: subprocess.Popen[bytes]
    out: Path

    def peak_kib(self) -> int:
        return _status_kib(self.process.pid, "VmHWM")

    def rss_kib(self) -> int:
        return _status_kib(self.process.pid, "VmRSS")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(60)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(60)
        # A line the kill cut short is not output: the restart appends after the last
        # whole one.
        data = self.out.read_bytes() if self.out.exists() else b""
        self.out.write_bytes(data[:data.rfind(b"\n") + 1])


# -- tidemark capture ---------------------------------------------------------------------
class _CaptureRunning(_ChildRunning):
    def __init__(self, source: SourceUnderTest, where: Path, args: list[str]) -> None:
        super().__init__(source)
        self.out = where / "capture.jsonl"
        self.err = where / "capture.err"
        with self.out.open("ab") as out, self.err.open("ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tidemark", "capture", "--dsn", source.dsn,
                 "--offsets", str(where / "offsets.json"), "--offset-flush-interval-ms", "0",
                 "--progress-interval-s", "0", *args],
                stdout=out, stderr=err)

    def json_lines(self) -> list[str]:
        """The complete lines written so far, as written."""
        assert self.process.poll() is None, self.err.read_text()[-3000:]
        lines = self.out.read_bytes().decode().split("\n")[:-1]
        return [line for line in lines if line]

    def changes(self) -> list[ChangeRow]:
        return from_json_values([json.loads(line)["value"] for line in self.json_lines()],
                                self.source)

class CaptureRuntime(Runtime):
    name = "capture"

    def open(self, source: SourceUnderTest, where: Path, **settings: Any) -> Running:
        args = settings.pop("capture_args", None)
        assert not settings, "capture takes no connector settings here, only capture_args"
        return _CaptureRunning(source, where, source.capture_args() if args is None else args)


# -- the engine, in a process of its own -----------------------------------------------------
_ENGINE_CHILD = Path(__file__).with_name("engine_child.py")
#: The engine's in-flight limit in the matrix: what a SIGKILL may redeliver at most.
MAX_IN_FLIGHT = 100


def _status_kib(pid: int, field: str) -> int:
    """A memory line of a process's status (``VmRSS``, ``VmHWM``), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


class EngineRunning(_ChildRunning):
    """The engine in :mod:`conformance.engine_child`, its output in a file."""

    def __init__(self, source: SourceUnderTest, where: Path, converter: str,
                 settings: dict[str, Any]) -> None:
        super().__init__(source)
        self.converter = converter
        self.out = where / f"engine-{converter}.out"
        self.err = where / f"engine-{converter}.err"
        json_options = settings.pop("json_options", {})
        connector, values = source.engine_connector(**settings)
        with self.err.open("ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, str(_ENGINE_CHILD), "--connector", connector,
                 "--settings", json.dumps(values), "--converter", converter,
                 "--out", str(self.out), "--offsets", str(where / "offsets.db"),
                 "--max-in-flight", str(MAX_IN_FLIGHT),
                 "--json-options", json.dumps(json_options)], stderr=err)

    def records(self) -> list[tuple[Any, ...]]:
        """Every record the engine wrote so far (across restarts): (identity, value,
        Avro schema, key, destination)."""
        if not self.out.exists():
            return []
        lines = self.out.read_bytes().split(b"\n")[:-1]  # complete lines only
        return [pickle.loads(base64.b64decode(line)) for line in lines if line]

    def changes(self) -> list[ChangeRow]:
        assert self.process.poll() is None, \
            f"the engine ({self.converter}) stopped: {self.err.read_text()[-3000:]}"
        return _decode(self.records(), self.converter, self.source)

    def json_lines(self) -> list[str]:
        """The JSON converter's records as ``{"topic":…,"key":…,"value":…}`` lines, as
        Debezium's references hold them."""
        assert self.converter == "json"
        return [f'{{"topic":"{r[4]}","key":{r[3] or "null"},"value":{r[1] or "null"}}}'
                for r in self.records()]

    def redelivered(self) -> int:
        """Records delivered more than once (a change's identity seen before)."""
        identities = [record[0] for record in self.records() if record[1] is not None]
        return len(identities) - len(set(identities))


def _b64(value: Any) -> Any:
    """An Avro-decoded value in the shape Debezium JSON gives it (bytes as base64)."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _b64(v) for k, v in value.items()}
    return value


def _uncell(value: Any, names: list[str]) -> Any:
    """A Debezium envelope (text or decoded) whose *names* are ScyllaDB's cells, with
    plain values: a cell's value, and for a null cell (the change left the column as it
    was) Debezium's placeholder, which the decoder reads as unavailable."""
    envelope = json.loads(value) if isinstance(value, (str, bytes)) else value
    if not isinstance(envelope, dict):
        return envelope
    for part in ("before", "after"):
        row = envelope.get(part)
        if isinstance(row, dict):
            for name in names:
                cell = row.get(name)
                assert cell is None or isinstance(cell, dict), f"{name}: {cell!r} no cell"
                row[name] = PLACEHOLDER if cell is None else cell["value"]
    return envelope


def _decode(records: list[tuple[Any, ...]], converter: str,
            source: SourceUnderTest) -> list[ChangeRow]:
    values = [(r[1], r[2]) for r in records if r[1] is not None]
    if converter == "arrow":
        assert all(isinstance(value, pa.RecordBatch) for value, _ in values)
        schema = source.arrow_schema()
        return [row for value, _ in values
                for row in from_batch(value, schema, source.types if source.typed else None)]
    if converter == "json":
        decoded = [value for value, _ in values]
    else:
        import fastavro  # noqa: PLC0415

        decoded = [_b64(fastavro.schemaless_reader(io.BytesIO(value), schema))
                   for value, schema in values]
    if source.engine_cells():
        decoded = [_uncell(value, source.names[1:]) for value in decoded]
    return from_json_values(decoded, source)


class EngineRuntime(Runtime):
    def __init__(self, converter: str) -> None:
        self.converter = converter
        self.name = f"engine-{converter}"

    def open(self, source: SourceUnderTest, where: Path, **settings: Any) -> Running:
        return EngineRunning(source, where, self.converter, settings)


# -- the Spark source ---------------------------------------------------------------------
class _SparkRunning(Running):
    """A streaming query run with Trigger.AvailableNow each time it is asked for its
    changes (the first run takes the stream's starting position)."""

    def __init__(self, source: SourceUnderTest, where: Path, spark: Any) -> None:
        super().__init__(source)
        self.spark = spark
        self.where = where
        self.collected: list[ChangeRow] = []
        self._trigger()

    def _trigger(self) -> None:
        import tidemark.spark as ts  # noqa: PLC0415

        stream = ts.read_table(self.spark, dsn=self.source.dsn, table=self.source.table,
                               **self.source.spark_options())

        def collect(frame: Any, _batch: int) -> None:
            types = self.source.types if self.source.typed else None
            schema = self.source.arrow_schema()
            self.collected += [from_text(row.asDict(), schema, types)
                               for row in frame.collect()]

        query = (stream.writeStream.option("checkpointLocation", str(self.where / "chk"))
                 .foreachBatch(collect).trigger(availableNow=True).start())
        assert query.awaitTermination(120), "Trigger.AvailableNow did not stop"
        assert query.exception() is None, query.exception()

    def changes(self) -> list[ChangeRow]:
        self._trigger()
        return list(self.collected)


class SparkRuntime(Runtime):
    name = "spark"
    kill_refusal = ("the Spark source runs inside the user's driver: its SIGKILL is the "
                    "driver's, proven in the tidemark run column")

    def __init__(self, spark: Any = None) -> None:
        self.spark = spark

    def open(self, source: SourceUnderTest, where: Path, **settings: Any) -> Running:
        assert self.spark is not None
        return _SparkRunning(source, where, self.spark)


# -- tidemark run ----------------------------------------------------------------------------
class PipelineRunning(Running):
    """``tidemark run`` with Trigger.AvailableNow, in this process's Spark session each
    time it is asked for its rows; :meth:`crash_at` runs it once in a process of its own
    that a named fault point kills."""

    def __init__(self, source: SourceUnderTest, where: Path, spark: Any,
                 extra_source: str = "") -> None:
        from tidemark.pipeline import load_config  # noqa: PLC0415

        super().__init__(source)
        self.spark = spark
        self.where = where
        self.lake = where / "lake" / "mx"
        self.file = where / "pipeline.toml"
        where.mkdir(parents=True, exist_ok=True)
        # One core, no UI, one shuffle partition: a child driver starts sooner (the
        # session of this process is the tests' own; these settings are the file's).
        self.file.write_text(
            f'[source]\ndsn = "{source.dsn}"\n{source.pipeline_source()}{extra_source}'
            f'[spark]\ncheckpoint = "{where}/chk"\navailable_now = true\n'
            'master = "local[1]"\nconf = { "spark.ui.enabled" = "false", '
            '"spark.sql.shuffle.partitions" = "1" }\n'
            f'[targets."{source.table}"]\npath = "{self.lake}"\nkeys = ["id"]\n')
        self.config = load_config(self.file)
        self._run()

    def _run(self) -> None:
        from tidemark.pipeline.runner import Pipeline  # noqa: PLC0415

        Pipeline(self.config, spark=self.spark).run()

    def _next_batch(self) -> int:
        """The batch the next run starts with: one Spark logged and did not commit, or
        the one after the last."""
        def ids(log: str) -> set[int]:
            return {int(p.name) for p in (self.where / "chk" / log).glob("*")
                    if p.name.isdigit()}
        offsets, commits = ids("offsets"), ids("commits")
        return max(offsets) if offsets - commits else max(offsets, default=-1) + 1

    def crash_at(self, point: str) -> None:
        """Run ``tidemark run`` in a process group of its own with ``TIDEMARK_FAULT`` at
        *point* of its first batch, and wait for the fault's SIGKILL."""
        spec = f"{point}:{self._next_batch()}"
        log = self.where / f"run-{point}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "tidemark", "run", "--available-now", str(self.file)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "TIDEMARK_FAULT": spec})
        try:
            code = process.wait(240)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)
        assert code == -signal.SIGKILL, \
            f"TIDEMARK_FAULT={spec}: exit {code}: {log.read_text(errors='replace')[-3000:]}"

    def rows(self) -> Rows:
        from tidemark.pipeline.compare import delta_rows  # noqa: PLC0415

        self._run()
        names = self.source.names
        found = delta_rows(str(self.lake), names)
        keys = [r[0] for r in found]
        assert len(keys) == len(set(keys)), f"rows twice in Delta: {sorted(keys)}"
        types = self.source.types if self.source.typed else None
        schema = self.source.arrow_schema()
        return canon_rows({r[0]: from_text(dict(zip(names, r, strict=True)), schema, types)
                           for r in found})


class PipelineRuntime(Runtime):
    name = "run"
    kill_refusal = None

    def __init__(self, spark: Any = None) -> None:
        self.spark = spark

    def open(self, source: SourceUnderTest, where: Path, **settings: Any) -> Running:
        assert self.spark is not None
        return PipelineRunning(source, where, self.spark)


RUNTIMES = ("capture", "engine-json", "engine-avro", "engine-arrow", "spark", "run")
SPARK_RUNTIMES = ("spark", "run")


def make_runtime(name: str, spark: Any = None) -> Runtime:
    if name == "capture":
        return CaptureRuntime()
    if name.startswith("engine-"):
        return EngineRuntime(name.removeprefix("engine-"))
    if name == "spark":
        return SparkRuntime(spark)
    return PipelineRuntime(spark)


@contextlib.contextmanager
def opened(runtime: Runtime, source: SourceUnderTest, where: Path,
           **settings: Any) -> Iterator[Running]:
    where.mkdir(parents=True, exist_ok=True)
    running = runtime.open(source, where, **settings)
    try:
        yield running
    finally:
        with contextlib.suppress(Exception):
            running.close()

