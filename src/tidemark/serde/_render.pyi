from collections.abc import Callable
from typing import Any

class EventRenderer:
    """Writes the Debezium JSON key and value of one table schema's row events."""

    def __init__(
        self,
        kinds: bytes,
        functions: tuple[Callable[[str], str] | None, ...],
        names: tuple[str, ...],
        nulls: tuple[str, ...],
        placeholders: tuple[str, ...],
        key_indexes: tuple[int, ...],
        key_names: tuple[str, ...],
        unavailable: object,
        binary: Callable[[Any], str],
        escape: Callable[[str], str],
        general: Callable[[Any], tuple[str, str]],
        source_parts: Callable[[Any, Any], tuple[str, ...]],
        ts_fields: Callable[[int], str],
        transaction: Callable[[Any], str] | None,
        params: bytes = ...,
    ) -> None: ...
    def __call__(self, event: Any, /) -> tuple[str, str]: ...
    def lines(
        self,
        rows: list[tuple[Any, Any]],
        op: str,
        head: str,
        tail: str,
        ts_text: str,
        tombstones: bool,
        /,
    ) -> list[str]:
        """The JSON lines of one batch of rows of this schema (one rows event)."""
