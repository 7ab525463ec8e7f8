"""public.orders kept in a Delta table by tidemark's apply: ``create_auto_cdc_flow``'s
parameters, without a MERGE-capable table connector (see tidemark.spark.cdc_flow)."""

import os

from tidemark.spark.cdc_flow import create_delta_cdc_flow

create_delta_cdc_flow(
    target="orders_delta",
    source="orders_changes",
    keys=["id"],
    # tidemark's commit order; any column or SQL expression works, as in
    # create_auto_cdc_flow. Deletes and truncates come from tidemark's _op column.
    sequence_by=["_commit_lsn", "_seq"],
    stored_as_scd_type=1,
    path=os.environ.get("TIDEMARK_LAKE", "/tmp/tidemark-orders/lake") + "/orders",
)
