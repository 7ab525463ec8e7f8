"""``tidemark run``: a pipeline file turned into a Spark streaming query into Delta Lake.

:func:`load_config` validates a ``pipeline.toml`` before Spark starts;
:class:`Pipeline` runs it (one envelope stream over every target table, ``apply_changes``
per table and batch, exactly once across restarts).
"""

from tidemark.pipeline.config import PipelineConfig, Target, load_config
from tidemark.pipeline.progress import BatchReport, format_report

__all__ = ["BatchReport", "PipelineConfig", "Target", "format_report", "load_config"]
