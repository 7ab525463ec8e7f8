"""The Spark stream of CDC log tables (PostgreSQL or SQLite): stream groups read over the
query's partitions (:mod:`.reader`). Registered in :mod:`tidemark.spark.sources`."""
