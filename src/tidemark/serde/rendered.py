"""A change event that carries its own Debezium JSON key and value texts.

A source that can write the JSON straight from its wire format (the PostgreSQL task on
the fused path, :mod:`tidemark.source.postgres.pgoutput_json`) emits :class:`RenderedEvent` s when
the engine asks it to (see :mod:`tidemark.engine.prerender`), and
:class:`~tidemark.engine.converters.DebeziumJsonConverter` passes the texts through
instead of serializing the event again.

A RenderedEvent is a complete :class:`~tidemark.event.ChangeEvent`: transforms,
routing and consumers reading ``record.event`` see the same values as on the general
path. Only its row (``raw_after``, or ``raw_before`` for a delete) is decoded lazily,
from the source message the event keeps, on first access: keeping ten decoded column
values alive per in-flight event costs more than writing its JSON, and most consumers
of JSON never look at them.

The texts are only valid for the event as it was emitted: code that derives a changed
event from one (``msgspec.structs.replace``) must not hand the result to the converter;
the engine therefore asks for rendered events only when no transform may replace
events (transforms that declare ``keeps_event``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from tidemark.event import ChangeEvent, WireTuple


class _Pending(tuple[()]):
    """Type of :data:`PENDING`: an empty tuple (so it is a valid row type) that stays
    the one instance across pickling."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<decoded on access>"

    def __reduce__(self) -> str:
        return "PENDING"


#: The slot value of a row that has not been decoded yet.
PENDING: Final = _Pending()

# The ChangeEvent slots behind the properties below (read and memoized directly: the
# struct is frozen to everyone else).
_BEFORE: Final[Any] = ChangeEvent.__dict__["raw_before"]
_AFTER: Final[Any] = ChangeEvent.__dict__["raw_after"]


class RenderedEvent(ChangeEvent, frozen=True, gc=False):
    """A :class:`ChangeEvent` plus its Debezium JSON texts.

    ``key_text`` is the key (None for a keyless table), ``value_text`` the value, both
    as :meth:`DebeziumJsonSerializer.key_and_value` writes them in the options the
    source was given. A row given as :data:`PENDING` is ``decode_row(wire)``, computed
    on first access.
    """

    key_text: str | None = None
    value_text: str = ""
    wire: bytes = b""
    decode_row: Callable[[bytes], WireTuple] | None = None

    @property  # type: ignore[misc]  # a lazy field
    def raw_before(self) -> WireTuple | None:
        value: WireTuple | None = _BEFORE.__get__(self)
        if value is PENDING:
            value = self._decoded(_BEFORE)
        return value

    @property  # type: ignore[misc]  # a lazy field
    def raw_after(self) -> WireTuple | None:
        value: WireTuple | None = _AFTER.__get__(self)
        if value is PENDING:
            value = self._decoded(_AFTER)
        return value

    def _decoded(self, slot: Any) -> WireTuple:
        assert self.decode_row is not None
        row = self.decode_row(self.wire)
        slot.__set__(self, row)  # memoized; racing threads store equal tuples
        return row
