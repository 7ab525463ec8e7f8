"""Whether the engine's tasks may hand it pre-rendered Debezium JSON.

A source that can write Debezium JSON straight from its wire format (the PostgreSQL
task) skips most of the serializer's work; that only pays, and is only correct, when
the pipeline would pass the texts through unchanged: the converter accepts rendered
events (:attr:`DebeziumJsonConverter.rendered_options`) and no transform may replace an
event (every transform declares ``keeps_event``), so the texts still describe the
event the converter gets. Otherwise tasks emit plain change events, as before.

With no transforms at all, a rendering task may go one step further and make the
converter's records itself (:func:`converted_records`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tidemark.engine.config import DeliveryMode
from tidemark.engine.converters import Converter, DebeziumJsonConverter
from tidemark.engine.transforms import Transform
from tidemark.serde.debezium_json import DebeziumJsonOptions
from tidemark.source.spi import RendersDebeziumJson, SourceTask

log = logging.getLogger(__name__)


def rendering_options(converter: Converter,
                      transforms: Sequence[Transform]) -> DebeziumJsonOptions | None:
    """The options tasks should render in for this pipeline, or None (do not render)."""
    options: DebeziumJsonOptions | None = getattr(converter, "rendered_options", None)
    if options is None:
        return None
    if not all(getattr(t, "keeps_event", False) for t in transforms):
        return None
    return options


def converted_records(converter: Converter, transforms: Sequence[Transform],
                      mode: DeliveryMode) -> bool:
    """Whether rendering tasks may hand over the converter's records themselves
    (:class:`RenderedRecord`): only with no transforms (they take events), into the
    Debezium JSON converter itself (which passes those records on), and not with
    per-key delivery, whose routing reads each event's key."""
    return (not transforms and type(converter) is DebeziumJsonConverter
            and mode != DeliveryMode.PER_KEY)


def offer_rendering(task: SourceTask, options: DebeziumJsonOptions | None, *,
                    records: bool = False, lines: bool = False) -> bool:
    """Ask *task* to render in *options* if it can (with *records*, to make
    :class:`RenderedRecord` s too; with *lines*, to write JSON lines instead, for a
    lines consumer with no transforms); True if it will."""
    if options is None or not isinstance(task, RendersDebeziumJson):
        return False
    accepted = task.render_debezium_json(options, converted_records=records, lines=lines)
    log.debug("task %r %s to render Debezium JSON", task,
              "agreed" if accepted else "declined")
    return accepted
