"""The Spark stream of a PostgreSQL database: logical decoding (pgoutput) read on the
executors from copies of the query's slot (:mod:`.reader`, :mod:`.wal`), LSN offsets
(:mod:`.offsets`), snapshots from an exported snapshot (:mod:`.snapshot`), and the checks
and typed schemas before a query starts (:mod:`.schema`). Registered in
:mod:`tidemark.spark.sources`."""
