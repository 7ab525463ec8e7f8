"""A pytest plugin (loaded by the root conftest): every lake test (tests/lake) that
applies changes in this process runs twice, copy-on-write (the default) and
merge-on-read (a spec's ``copy_on_write`` taken as ``merge_on_read``), and in
merge-on-read each batch is followed by a check that delta-rs, Polars and DuckDB's delta
extension read the same rows. Spark's tests apply on executors, which this cannot reach:
they set ``merge`` themselves where they test it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delta_readers import check_readers_agree
from tidemark.lake import delta_writer
from tidemark.lake.spec import ApplySpec

#: Modules whose tests run on executors or in child processes, or test copy-on-write's
#: own file layout, or test merge-on-read only.
_ONE_MODE = {"test_lake_spark", "test_lake_split_apply", "test_lake_clustering",
             "test_lake_debezium_input", "test_merge_on_read_crash", "test_key_index"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    in_lake = Path(str(metafunc.definition.fspath)).parent.name == "lake"
    if "merge_mode" in metafunc.fixturenames and in_lake and module not in _ONE_MODE:
        metafunc.parametrize("merge_mode", ["copy_on_write", "merge_on_read"], indirect=True)


@pytest.fixture(autouse=True)
def merge_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    mode: str = getattr(request, "param", "copy_on_write")
    if mode == "merge_on_read":
        choose = delta_writer.merges_on_read

        def on_read(table: Any, batch: Any, spec: ApplySpec, uri: str) -> bool:
            if spec.merge == "copy_on_write":  # the tests' specs are made at import
                spec = dataclasses.replace(spec, merge="merge_on_read")
            return choose(table, batch, spec, uri)

        monkeypatch.setattr(delta_writer, "merges_on_read", on_read)
        real = delta_writer.merge_on_read

        def checked(table: Any, *args: Any, **kwargs: Any) -> Any:
            result = real(table, *args, **kwargs)
            check_readers_agree(kwargs["uri"])
            return result

        monkeypatch.setattr(delta_writer, "merge_on_read", checked)
    yield mode
