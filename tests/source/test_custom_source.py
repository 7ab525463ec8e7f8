"""A source defined in this module alone runs through every runtime: the engine,
``tidemark capture``, the Spark source and ``tidemark run``.

This is the proof that the core does not know which source it runs: the in-memory
source below (its kind, its connector and task for the engine and capture, its read
plan for Spark, its ``source`` block) is registered with
:func:`tidemark.source.registry.register` and nothing outside this module names it.

Its data is a pure function of the DSN, so every process (the capture command, Spark's
Python workers) sees the same source: ``memory://<table>/<transactions>`` holds a table
``memory.<table>`` (``id`` key, ``name``, ``qty``) changed by that many transactions;
transaction *t* inserts row *t*, updates row *t - 1* and, every fourth, deletes row
*t - 2*. Its position is ``10 * t + i`` for the *i*-th change of transaction *t*.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from tidemark.engine.engine import Engine
from tidemark.errors import ConfigError
from tidemark.event import ChangeEvent, Column, Op, Record, SourceContext, TableId, TableSchema
from tidemark.logical_type import INT64, STRING
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.offsets.store import Offset, OffsetReader
from tidemark.pipeline.compare import delta_rows, source_rows
from tidemark.pipeline.config import load_config
from tidemark.pipeline.runner import Pipeline
from tidemark.serde.debezium_json import DebeziumJsonOptions
from tidemark.source import registry
from tidemark.source.batch import SourceBatch
from tidemark.source.kind import Capture, CaptureRequest, SourceKind, SourceProgress
from tidemark.source.read_plan import (
    ChangeSink,
    Commit,
    Layout,
    LayoutColumn,
    ReadOptions,
    TableColumns,
)
from tidemark.source_block import BlockField, FieldType, SourceBlock

SCHEME = "memory://"
COLUMNS = ("id", "name", "qty")


# -- the data: a pure function of the DSN ------------------------------------------------
def _parse(dsn: str) -> tuple[str, int]:
    """``(table, transactions)`` of a ``memory://<table>/<transactions>`` DSN."""
    table, _, count = dsn.removeprefix(SCHEME).partition("/")
    if not table.isidentifier() or not count.isdigit():
        raise ConfigError("dsn", f"{dsn!r} is not a memory source; expected "
                          "memory://<table>/<transactions>, e.g. memory://orders/20")
    return table, int(count)


def _changes(t: int) -> list[tuple[str, tuple[str, str, str] | None,
                                   tuple[str, str, str] | None]]:
    """Transaction *t*'s changes: ``(op, before, after)`` with values as text."""
    out: list[tuple[str, Any, Any]] = [("c", None, (str(t), f"n{t}", str(t)))]
    if t > 1:
        out.append(("u", None, (str(t - 1), f"n{t - 1}", str(10 * t))))
    if t % 4 == 0:
        out.append(("d", (str(t - 2), None, None), None))
    return out


def _final_rows(count: int) -> list[tuple[Any, ...]]:
    rows: dict[int, tuple[Any, ...]] = {}
    for t in range(1, count + 1):
        for op, before, after in _changes(t):
            if op == "d":
                assert before is not None
                rows.pop(int(before[0]), None)
            else:
                assert after is not None
                rows[int(after[0])] = (int(after[0]), after[1], int(after[2]))
    return sorted(rows.values(), key=repr)


def _columns() -> tuple[Column, ...]:
    return (Column("id", INT64, "bigint", True, int, False),
            Column("name", STRING, "text", False, str),
            Column("qty", INT64, "bigint", False, int))


# -- the source block ------------------------------------------------------------------------
class MemoryFields(msgspec.Struct, frozen=True, gc=False):
    transaction: int


class MemoryBlock(SourceBlock):
    avro_name: ClassVar[str] = "io.example.memory.Source"
    table_fields: ClassVar[tuple[BlockField, ...]] = (BlockField("table", FieldType.STRING),)
    fields: ClassVar[tuple[BlockField, ...]] = (
        BlockField("transaction", FieldType.INT64, optional=False),)

    def position_text(self, position: int) -> str:
        return f"change {position % 10} of transaction {position // 10}"


BLOCK = MemoryBlock()


# -- the engine's connector and task -----------------------------------------------------------
class MemoryTask:
    """Polls one transaction per batch; its offset is the last transaction done."""

    def __init__(self, dsn: str, stop_at_end: bool = True) -> None:
        self.table, self.count = _parse(dsn)
        self.schema = TableSchema(TableId("memory", self.table), _columns(), (0,), "default")
        self.done = 0
        self.committed: list[Offset] = []

    @property
    def partition(self) -> str:
        return f"memory/{self.table}"

    def start(self, offsets: OffsetReader) -> None:
        saved = offsets.load(self.partition)
        self.done = int(saved["transaction"]) if saved else 0

    def poll(self) -> SourceBatch:
        if self.done >= self.count:
            return SourceBatch([], None, finished=True)
        t = self.done + 1
        self.done = t
        return SourceBatch(self.events(t), {"transaction": t}, finished=t == self.count)

    def events(self, t: int) -> list[Record]:
        now_us = time.time_ns() // 1000
        context = SourceContext("memory", "memory", "memory", 1_700_000_000_000_000 + t,
                                None, None, tx_id=str(t), commit_lsn=10 * t + 9,
                                source_fields=MemoryFields(t), block=BLOCK)
        return [ChangeEvent(Op(op), self.schema, before, after, context, 10 * t + i, i + 1,
                            i + 1, now_us)
                for i, (op, before, after) in enumerate(_changes(t))]

    def commit(self, offset: Offset) -> None:
        self.committed.append(offset)

    def stop(self) -> None:
        pass


class MemoryConnector:
    def __init__(self, dsn: str, stop_at_end: bool = True) -> None:
        _parse(dsn)
        self.dsn = dsn
        self.stop_at_end = stop_at_end

    @property
    def name(self) -> str:
        return "memory"

    def task_configs(self, tasks_max: int) -> list[Mapping[str, Any]]:
        return [{"dsn": self.dsn}]

    def create_task(self, config: Mapping[str, Any]) -> MemoryTask:
        return MemoryTask(str(config["dsn"]), self.stop_at_end)


# -- Spark's read plan ----------------------------------------------------------------------
class MemoryReadPlan:
    """Offsets ``{"transaction": t}``; one partition per batch."""

    def __init__(self, options: ReadOptions) -> None:
        self.dsn = options.dsn
        self.table, self.count = _parse(options.dsn)
        self.id = TableId("memory", self.table)
        if list(options.tables) != [self.id]:
            raise ConfigError("tables", f"a memory source holds {self.id} only")

    def tables(self) -> dict[TableId, TableColumns]:
        return {self.id: TableColumns(_columns())}

    def initial_offset(self) -> dict[str, Any]:
        return {"transaction": 0}

    def prepare_available_now(self) -> None:
        pass

    def latest(self, start: dict[str, Any], max_changes: int | None) -> dict[str, Any]:
        # Two transactions a batch, so a run has several batches.
        return {"transaction": min(self.count, int(start["transaction"]) + 2)}

    def report_latest(self) -> dict[str, Any] | None:
        return {"transaction": self.count}

    def plan(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[Any]:
        return [(int(start["transaction"]), int(end["transaction"]))]

    def read(self, partition: Any, sink: ChangeSink) -> Iterator[None]:
        first, last = partition
        sink.relation(Layout(1, "memory", self.table, tuple(
            LayoutColumn(c.name, c.is_key) for c in _columns())))
        for t in range(first + 1, last + 1):
            commit = Commit(10 * t + 9, 1_700_000_000_000_000 + t, t)
            for i, (op, before, after) in enumerate(_changes(t)):
                sink.add(1, op, after if op != "d" else before, 10 * t + i, i + 1, commit,
                         False, None)
            yield

    def commit(self, end: dict[str, Any]) -> None:
        pass

    def stop(self) -> None:
        pass


# -- the kind ----------------------------------------------------------------------------------
class NoProgress(SourceProgress):
    def lag_bytes(self, end: Mapping[str, Any]) -> int:
        return 0

    def batch_bytes(self, start: Mapping[str, Any] | None,
                    end: Mapping[str, Any]) -> int | None:
        return None


class MemoryKind(SourceKind):
    name = "memory"

    def claims(self, dsn: str, requested: str | None) -> bool:
        return dsn.startswith(SCHEME)

    def check_dsn(self, dsn: str, key: str) -> None:
        _parse(dsn)

    def redact_dsn(self, dsn: str) -> str:
        return dsn

    def default_schema(self, dsn: str) -> str:
        return "memory"

    def capture(self, request: CaptureRequest) -> Capture:
        return Capture(MemoryConnector(str(request.values["dsn"]), request.stop_at_end),
                       DebeziumJsonOptions(topic_prefix=request.topic_prefix,
                                           tombstones_on_delete=request.tombstones),
                       position_text=BLOCK.position_text)

    def position_text(self, position: int) -> str:
        return BLOCK.position_text(position)

    def log_position(self, offset: Mapping[str, Any]) -> int:
        return 10 * int(offset["transaction"]) + 9

    def progress(self, dsn: str, *, slot: str, tables: Sequence[str]) -> SourceProgress:
        return NoProgress()

    def identity_database(self, dsn: str) -> str:
        return dsn

    def read_plan(self, options: ReadOptions) -> MemoryReadPlan:
        return MemoryReadPlan(options)

    def table_rows(self, dsn: str, table: str, columns: Sequence[str],
                   text_columns: Sequence[str], utc_columns: Sequence[str]) -> list[Any]:
        _, count = _parse(dsn)
        assert tuple(columns) == COLUMNS
        return _final_rows(count)


@pytest.fixture(autouse=True)
def memory_kind() -> Iterator[MemoryKind]:
    kind = MemoryKind()
    registry.register(kind)
    # Spark's Python workers cannot import this test module: its classes travel by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        yield kind
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        registry.unregister(kind.name)


def test_the_registry_hands_out_the_kind_for_its_dsn(memory_kind: MemoryKind) -> None:
    assert registry.kind_of("memory://orders/3") is memory_kind
    assert registry.kind_of("host=db dbname=app").name == "postgres"


def test_the_engine_runs_it_and_resumes_from_saved_offsets() -> None:
    got: list[Any] = []
    store = MemoryOffsetStore()
    config = {"delivery_mode": "ordered", "offset_flush_interval_ms": 0}
    Engine(MemoryConnector("memory://orders/6"), got.append, config=config,
           offset_store=store).run()
    events = [json.loads(r.value) for r in got if r.value is not None]
    assert len(got) == len(events) + 1  # the delete's tombstone
    assert [e["op"] for e in events] == ["c", "c", "u", "c", "u", "c", "u", "d", "c", "u",
                                         "c", "u"]
    assert events[7]["before"] == {"id": 2, "name": None, "qty": None}
    assert events[0]["source"] == {
        "version": events[0]["source"]["version"], "connector": "memory", "name": "memory",
        "ts_ms": 1_700_000_000_000, "snapshot": "false", "db": "memory", "sequence": None,
        "ts_us": 1_700_000_000_000_001, "ts_ns": 1_700_000_000_000_001_000,
        "table": "orders", "transaction": 1}
    assert store.load("memory/orders") == {"transaction": 6}
    again: list[Any] = []
    Engine(MemoryConnector("memory://orders/8"), again.append, config=config,
           offset_store=store).run()
    assert [json.loads(r.value)["after"]["id"] for r in again[:1]] == [7]
    assert len(again) == 5 + 1  # transactions 7 and 8 only (and 8's delete's tombstone)


#: ``tidemark capture`` in a process of its own that first registers this module's kind
#: (as a package's ``tidemark.sources`` entry point would).
_CAPTURE = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from tidemark.source import registry
import {Path(__file__).stem} as source
registry.register(source.MemoryKind())
from tidemark.cli.main import main
sys.argv = ["tidemark", "capture", *sys.argv[1:]]
main()
"""


def _capture(*args: str) -> list[Any]:
    done = subprocess.run([sys.executable, "-c", _CAPTURE, *args], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_tidemark_capture_writes_it_and_resumes_from_its_offsets(tmp_path: Path) -> None:
    args = ["--offsets", str(tmp_path / "offsets.json"), "--stop-at-end",
            "--topic-prefix", "shop"]
    lines = _capture("--dsn", "memory://orders/5", *args)
    assert [(line["key"], line["value"]["op"] if line["value"] else None)
            for line in lines][:3] == [({"id": 1}, "c"), ({"id": 2}, "c"), ({"id": 1}, "u")]
    assert lines[0]["value"]["source"]["transaction"] == 1
    assert sum(1 for line in lines if line["value"] is None) == 1  # 4's delete's tombstone
    # Started again on more transactions, it resumes after what it wrote.
    again = _capture("--dsn", "memory://orders/7", *args)
    assert [line["value"]["after"]["id"] for line in again][:1] == [6]
    assert len(again) == 4  # transactions 6 and 7


def test_the_spark_source_reads_it(spark: SparkSession, tmp_path: Path) -> None:
    from tidemark import spark as ts  # noqa: PLC0415

    stream = ts.read_changes(spark, dsn="memory://orders/9", tables=["memory.orders"])
    batches: list[list[Any]] = []
    query = (stream.writeStream.foreachBatch(lambda df, _id: batches.append(df.collect()))
             .option("checkpointLocation", str(tmp_path / "chk"))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None
    rows = [r for batch in batches for r in batch]
    assert len([b for b in batches if b]) == 5  # two transactions a batch
    assert [r["_op"] for r in rows][:3] == ["c", "c", "u"]
    # The envelope's JSON rows hold the source's text of each value.
    assert [json.loads(r["after"]) for r in rows[:3]] == [
        {"id": "1", "name": "n1", "qty": "1"}, {"id": "2", "name": "n2", "qty": "2"},
        {"id": "1", "name": "n1", "qty": "20"}]
    assert len(rows) == sum(len(_changes(t)) for t in range(1, 10))


def test_tidemark_run_keeps_delta_equal_to_it(spark: SparkSession, tmp_path: Path) -> None:
    file = tmp_path / "pipeline.toml"
    file.write_text('[source]\ndsn = "memory://orders/11"\n'
                    f'[spark]\ncheckpoint = "{tmp_path}/chk"\navailable_now = true\n'
                    f'[targets."memory.orders"]\npath = "{tmp_path}/lake/orders"\n'
                    'keys = ["id"]\n')
    Pipeline(load_config(file), spark=spark).run()
    target = delta_rows(str(tmp_path / "lake/orders"), COLUMNS)
    assert target == source_rows("memory://orders/11", "memory.orders", COLUMNS)
    assert target == _final_rows(11)
