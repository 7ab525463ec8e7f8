"""public.orders from PostgreSQL: every change as a streaming table (its current rows:
``orders.sql``).

On the first run tidemark creates its publication and replication slot and loads the
table's existing rows (the snapshot); every run then reads what was committed since the
last one.
"""

import os

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession

import tidemark.spark

spark = SparkSession.active()
# Here, not in a query function: a pipeline's query functions may not change the session.
tidemark.spark.register(spark)

@dp.table(comment="Every change of public.orders, in commit order (_commit_lsn, _seq).")
def orders_changes() -> DataFrame:
    return tidemark.spark.read_table(
        spark, dsn=os.environ["TIDEMARK_DSN"], table="public.orders",
        slot="tidemark_orders", publication="tidemark_orders", snapshot="initial")
