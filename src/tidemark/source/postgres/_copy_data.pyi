from collections.abc import Callable
from typing import Any

GOT_LIMIT: int
GOT_EMPTY: int
GOT_END: int
GOT_OTHER: int

def read_copy(
    get: Callable[[int], tuple[int, Any]], batch: list[tuple[bytes, int]], limit: int, /
) -> tuple[int, Any]: ...
