from collections.abc import Callable

class LineWriter:
    """Writes the Debezium JSON line of one table schema's pgoutput row messages of one
    operation (see ``tidemark.source.postgres.pgoutput_json``)."""

    def __init__(
        self,
        kinds: bytes,
        params: bytes,
        functions: tuple[Callable[[str], str] | None, ...],
        names: tuple[bytes, ...],
        nulls: tuple[bytes, ...],
        placeholders: tuple[bytes, ...],
        memos: tuple[dict[bytes, str] | None, ...],
        key_indexes: tuple[int, ...],
        key_names: tuple[bytes, ...],
        delete: bool,
        tombstone: bool,
    ) -> None: ...
    def __call__(
        self, data: bytes, text: str, lsn: int, parts: tuple[str, str, str], /
    ) -> str: ...
