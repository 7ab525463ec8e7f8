"""tidemark: change data capture for Python and Apache Spark."""

__version__ = "0.1.0"
