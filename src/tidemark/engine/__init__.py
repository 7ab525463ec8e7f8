"""The embedded engine: parallel record processing with safe offset commits."""
