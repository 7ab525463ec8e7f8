"""The ``tidemark-delta`` sink's options (:mod:`tidemark.spark.delta_sink`); the sink
itself runs in ``test_declarative_pipeline.py``."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tidemark.errors import ConfigError
from tidemark.lake.spec import DEFAULT_DELETES
from tidemark.spark.delta_sink import SinkOptions, spec_for


def test_options_become_an_apply_spec_and_storage_options() -> None:
    options = SinkOptions.parse({
        "path": "/lake/orders", "keys": "id, region", "sequenceBy": "version",
        "deletesColumn": "is_deleted", "exceptColumnList": "note",
        "storedAsScdType": "2", "trackHistoryColumnList": "price",
        "storage.AWS_REGION": "eu-west-1", "queryName": "spark's own",
    })
    spec = options.spec
    assert spec.keys == ("id", "region") and spec.sequence_by == ("version",)
    assert spec.stored_as_scd_type == 2 and spec.except_column_list == ("note",)
    assert spec.track_history_column_list == ("price",)
    assert spec.apply_as_deletes.equals(pc.field("is_deleted"))
    assert not spec.ordered_batches, "a sequence of the user's may come in any order"
    assert options.storage_options == {"AWS_REGION": "eu-west-1"}
    assert options.staging == "/lake/_orders_tidemark_staging"
    assert options.app_id.startswith("tidemark-delta-")
    tidemark = SinkOptions.parse({"path": "/lake/o", "keys": "id"})
    assert tidemark.spec.ordered_batches and tidemark.spec.apply_as_deletes.equals(
        DEFAULT_DELETES)


@pytest.mark.parametrize(("options", "key", "says"), [
    ({"keys": "id"}, "path", "required"),
    ({"path": "/lake/o"}, "keys", "required"),
    ({"path": "/lake/o", "keys": "id", "key": "id"}, "key", "sequenceBy"),
    ({"path": "/lake/o", "keys": "id", "storedAsScdType": "3"}, "storedAsScdType", "1 or 2"),
    ({"path": "s3://b/o", "keys": "id"}, "stagingPath", "not a local path"),
    ({"path": "/lake/o", "keys": "id", "stepRows": "0"}, "stepRows", "positive"),
])
def test_a_bad_option_is_named(options: dict[str, str], key: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        SinkOptions.parse(options)
    assert info.value.key == key and says in str(info.value)


def test_rows_without_tidemark_s_op_column_have_no_deletes_unless_a_column_says() -> None:
    spec = SinkOptions.parse({"path": "/lake/o", "keys": "id", "sequenceBy": "v"}).spec
    plain = pa.schema([("id", pa.int64()), ("v", pa.int64())])
    adapted = spec_for(spec, plain)
    assert adapted.apply_as_deletes.equals(pc.scalar(False))
    assert adapted.apply_as_truncates.equals(pc.scalar(False))
    tidemark = pa.schema([("id", pa.int64()), ("_op", pa.string())])
    assert spec_for(spec, tidemark) is spec
