"""``tidemark verify``: prove that a pipeline's Delta targets equal their source tables
(row checksums computed where the data is, :mod:`tidemark.row_checksum`)."""
