"""Applying change rows to Delta Lake tables, independent of Spark (MISSION K2, K3, K4).

:func:`apply_changes` takes one batch of change rows (an Arrow table, see
:mod:`tidemark.lake.change_rows`) and an :class:`ApplySpec` in Databricks ``APPLY
CHANGES`` terms, and merges the batch into a Delta table with delta-rs in one commit.
:func:`apply_changes_in_steps` does the same for a batch given in pieces, holding one at a
time, still in one commit. :func:`changes_from_debezium_json` turns Debezium JSON change
events into change rows.
"""

from tidemark.lake.debezium_input import changes_from_debezium_file, changes_from_debezium_json
from tidemark.lake.delta_writer import ApplyResult, apply_changes, apply_changes_in_steps
from tidemark.lake.spark_input import apply_debezium_dataframe
from tidemark.lake.spec import ApplySpec

__all__ = ["ApplyResult", "ApplySpec", "apply_changes", "apply_changes_in_steps",
           "apply_debezium_dataframe",
           "changes_from_debezium_file", "changes_from_debezium_json"]
