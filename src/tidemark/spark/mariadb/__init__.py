"""The Spark stream of a MariaDB server: whole binlog transactions per batch
(:mod:`.reader`). Registered in :mod:`tidemark.spark.sources`."""
