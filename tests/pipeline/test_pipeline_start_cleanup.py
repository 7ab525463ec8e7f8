"""A ``tidemark run`` whose start fails after its stream made the publication (or the
slot) drops what that start made, and only that: a slot or publication that existed
before survives, and so does everything once a batch was planned (the checkpoint then
relies on the slot). The same holds for the checkpoint and the targets' directories:
the ones this start made are removed, ones that existed keep what they held."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from conftest import Database
from tidemark.pipeline import load_config
from tidemark.pipeline.directories import MadeDirectories
from tidemark.pipeline.runner import Pipeline, PipelineError

pytestmark = pytest.mark.integration


def _config_file(tmp_path: Path, db: Database, name: str) -> Path:
    file = tmp_path / "pipeline.toml"
    file.write_text(f'[source]\ndsn = "{db.dsn}"\nslot = "s_{db.name}"\n'
                    f'publication = "p_{db.name}"\n[spark]\ncheckpoint = "chk"\n'
                    f'available_now = true\napp_name = "{name}"\n'
                    '[targets."public.t"]\npath = "lake/t"\nkeys = ["id"]\n')
    return file


@contextlib.contextmanager
def _query_named(spark: SparkSession, name: str) -> Iterator[None]:
    """A streaming query holding *name*: Spark refuses to start a second one with it,
    after the pipeline's stream was loaded (its publication made)."""
    query = spark.readStream.format("rate").load().writeStream.format("noop") \
        .queryName(name).start()
    try:
        yield
    finally:
        query.stop()


def _slots(db: Database) -> list[str]:
    return [r[0] for r in db.query("SELECT slot_name FROM pg_replication_slots "
                                   "WHERE database = current_database()")]


def _publications(db: Database) -> list[str]:
    return [r[0] for r in db.query("SELECT pubname FROM pg_publication")]


def test_a_failed_start_drops_the_publication_it_made(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    name = f"busy_{db.name}"
    config = load_config(_config_file(tmp_path, db, name))
    with _query_named(spark, name), pytest.raises((PipelineError, Exception)) as caught:
        Pipeline(config, spark=spark).run()
    assert name in str(caught.value)  # Spark's refusal, after the stream was loaded
    assert _publications(db) == []
    assert _slots(db) == []
    assert not (tmp_path / "chk").exists() and not (tmp_path / "lake").exists()
    # The next start makes them again and runs.
    Pipeline(config, spark=spark).run()
    assert _publications(db) == [f"p_{db.name}"] and _slots(db) == [f"s_{db.name}"]


def test_a_failed_start_keeps_the_slot_and_publication_it_found(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    db.autocommit(f"CREATE PUBLICATION p_{db.name} FOR TABLE t",
                  f"SELECT pg_create_logical_replication_slot('s_{db.name}', 'pgoutput')")
    name = f"busy_{db.name}"
    config = load_config(_config_file(tmp_path, db, name))
    with _query_named(spark, name), pytest.raises(Exception, match=name):
        Pipeline(config, spark=spark).run()
    assert _publications(db) == [f"p_{db.name}"]
    assert _slots(db) == [f"s_{db.name}"]


def test_a_failed_start_keeps_the_directories_it_found(
        spark: SparkSession, db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    (tmp_path / "chk").mkdir()
    (tmp_path / "chk" / "notes.txt").write_text("a previous run's")
    (tmp_path / "lake").mkdir()
    name = f"busy_{db.name}"
    config = load_config(_config_file(tmp_path, db, name))
    with _query_named(spark, name), pytest.raises(Exception, match=name):
        Pipeline(config, spark=spark).run()
    assert (tmp_path / "chk" / "notes.txt").read_text() == "a previous run's"
    assert (tmp_path / "lake").is_dir()
    assert not (tmp_path / "lake" / "t").exists()  # made by the start: removed


def test_a_failed_start_removes_its_leaf_but_not_a_parent_another_start_wrote_in(
        tmp_path: Path) -> None:
    """Two pipelines under one new parent start at once: the first's failure removes
    its own directory, and the parent only if nothing else is in it."""
    made = MadeDirectories()
    made.make(str(tmp_path / "srv" / "p1" / "chk"), "spark.checkpoint")
    (tmp_path / "srv" / "p1" / "chk" / "state").write_text("this start's")
    (tmp_path / "srv" / "p2").mkdir()  # the other pipeline, started meanwhile
    (tmp_path / "srv" / "p2" / "offsets").write_text("the other start's")
    made.remove()
    assert not (tmp_path / "srv" / "p1").exists()  # the leaf, and its emptied parent
    assert (tmp_path / "srv" / "p2" / "offsets").read_text() == "the other start's"


def test_a_directory_another_start_made_first_is_not_removed(tmp_path: Path) -> None:
    """A directory that exists when the start would make it is not the start's."""
    (tmp_path / "srv").mkdir()
    made = MadeDirectories()
    made.make(str(tmp_path / "srv" / "chk"), "spark.checkpoint")
    made.make(str(tmp_path / "srv" / "chk"), "lake")  # already there: not made again
    made.remove()
    assert (tmp_path / "srv").is_dir() and not (tmp_path / "srv" / "chk").exists()
