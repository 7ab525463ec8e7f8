"""What makes a pipeline's identity in its checkpoint (:mod:`tidemark.pipeline.identity`),
from pipeline files alone: no server is asked, so no database is needed here. The
refusal of a running source's pipeline, end to end: test_checkpoint_owner.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tidemark.errors import ConfigError
from tidemark.lake.written_targets import FILE_NAME as TARGETS_FILE
from tidemark.pipeline import load_config
from tidemark.pipeline.config import PipelineConfig
from tidemark.pipeline.identity import FILE_NAME, CheckpointOwnerError, claim_checkpoint

PG = "host=db1 port=5432 dbname=app user=u password=secret"


def _config(tmp_path: Path, source: str, *targets: str, name: str = "p") -> PipelineConfig:
    file = tmp_path / f"{name}.toml"
    file.write_text(f'[source]\n{source}\n[spark]\ncheckpoint = "chk"\n' + "".join(
        f'[targets."{t}"]\npath = "lake/{t.split(".")[1]}"\nkeys = ["id"]\n' for t in targets))
    config = load_config(file)
    Path(config.checkpoint).mkdir(exist_ok=True)  # a start makes it, after its checks
    return config


def _record(tmp_path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((tmp_path / "chk" / FILE_NAME).read_text())
    return data


def test_the_first_start_records_the_owner_and_secrets_stay_out(tmp_path: Path) -> None:
    claim_checkpoint(_config(tmp_path, f'dsn = "{PG}"\nslot = "s1"', "public.a"))
    assert _record(tmp_path) == {"source": "postgres", "database": "app", "slot": "s1",
                                 "targets": {"public.a": str(tmp_path / "lake/a")}}
    assert "secret" not in (tmp_path / "chk" / FILE_NAME).read_text()


@pytest.mark.parametrize(("owner", "other", "reason"), [
    (f'dsn = "{PG}"\nslot = "s1"', f'dsn = "{PG}"\nslot = "s2"',
     "its slot is s1, not s2"),
    (f'dsn = "{PG}"\nslot = "s1"', 'dsn = "host=db1 dbname=shop"\nslot = "s1"',
     "its source is app, not shop"),
    (f'dsn = "{PG}"\nslot = "s1"', f'dsn = "{PG}"\nkind = "logtable"',
     "its source is postgres, not logtable"),
    ('dsn = "mariadb://u:p@m1:3306/app"', 'dsn = "mariadb://u:p@m2:3306/app"',
     "its source is m1:3306, not m2:3306"),
    ('dsn = "sqlite:///data/one.db"', 'dsn = "sqlite:///data/two.db"',
     "its source is /data/one.db, not /data/two.db"),
], ids=["other-slot", "other-database", "other-kind", "other-mariadb", "other-sqlite-file"])
def test_another_source_is_refused_and_nothing_is_written(
        tmp_path: Path, owner: str, other: str, reason: str) -> None:
    claim_checkpoint(_config(tmp_path, owner, "public.a", name="owner"))
    record = (tmp_path / "chk" / FILE_NAME).read_bytes()
    with pytest.raises(CheckpointOwnerError, match=reason) as refused:
        claim_checkpoint(_config(tmp_path, other, "public.a", name="other"))
    assert str(refused.value).startswith(f"spark.checkpoint: {tmp_path / 'chk'} belongs to "
                                         "another pipeline (")
    assert (tmp_path / "chk" / FILE_NAME).read_bytes() == record
    assert [f.name for f in (tmp_path / "chk").iterdir()] == [FILE_NAME]


def test_targets_may_be_added_and_removed_but_not_all_replaced(tmp_path: Path) -> None:
    source = f'dsn = "{PG}"\nslot = "s1"'
    claim_checkpoint(_config(tmp_path, source, "public.a", "public.b"))
    # Adding a target, then dropping one: the same pipeline, whose record follows.
    claim_checkpoint(_config(tmp_path, source, "public.a", "public.b", "public.c"))
    claim_checkpoint(_config(tmp_path, source, "public.b", "public.c"))
    assert set(_record(tmp_path)["targets"]) == {"public.b", "public.c"}  # type: ignore[arg-type]
    with pytest.raises(CheckpointOwnerError, match="it has none of these targets"):
        claim_checkpoint(_config(tmp_path, source, "public.a", "public.d"))
    # The same tables into other Delta tables are not its targets either.
    config = _config(tmp_path, source, "public.b", "public.c")
    moved = dataclasses.replace(config, targets=tuple(
        dataclasses.replace(t, path=f"{t.path}-v2") for t in config.targets))
    with pytest.raises(CheckpointOwnerError, match="it has none of these targets"):
        claim_checkpoint(moved)


def test_another_host_of_the_same_database_and_slot_is_the_same_pipeline(
        tmp_path: Path) -> None:
    """A failover slot is read from the promoted standby, under another address."""
    claim_checkpoint(_config(tmp_path, f'dsn = "{PG}"\nslot = "s1"', "public.a"))
    claim_checkpoint(_config(tmp_path, 'dsn = "postgresql://u@db2:6432/app"\nslot = "s1"',
                             "public.a"))


def test_a_checkpoint_from_before_the_record_is_adopted_by_its_own_targets_only(
        tmp_path: Path) -> None:
    checkpoint = tmp_path / "chk"
    checkpoint.mkdir()
    (checkpoint / "offsets").mkdir()
    (checkpoint / TARGETS_FILE).write_text(json.dumps(
        {str(tmp_path / "lake/a"): {"table": "public.a", "delta_table_id": "x"}}))
    with pytest.raises(CheckpointOwnerError, match=r"its batches wrote to public\.a -> "):
        claim_checkpoint(_config(tmp_path, f'dsn = "{PG}"', "public.b", name="other"))
    assert not (checkpoint / FILE_NAME).exists()
    claim_checkpoint(_config(tmp_path, f'dsn = "{PG}"', "public.a", "public.b"))
    assert _record(tmp_path)["slot"] == "tidemark_spark"


def test_a_record_that_is_not_one_is_a_clear_error(tmp_path: Path) -> None:
    config = _config(tmp_path, f'dsn = "{PG}"', "public.a")
    (tmp_path / "chk" / FILE_NAME).write_text("{not json")
    with pytest.raises(ConfigError, match=rf"{FILE_NAME} is not tidemark's record "
                                                   r".*delete it to have this pipeline adopt"):
        claim_checkpoint(config)
