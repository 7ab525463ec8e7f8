"""The replication stream's XLogData messages out of libpq's buffer, in bulk
(:func:`read_copy`).

Compiled where ``_copy_data`` is built (the same loop in C); :func:`read_copy_python`
is the reference the compiled one is tested against and the fallback.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

#: Statuses of :func:`read_copy`: *batch* holds *limit* messages; libpq's buffer has no
#: complete message; the COPY ended (or failed); another message than XLogData came
#: (returned for the caller to handle).
GOT_LIMIT: Final = 0
GOT_EMPTY: Final = 1
GOT_END: Final = 2
GOT_OTHER: Final = 3

_XLOG_DATA: Final = 0x77  # 'w'
_HEADER: Final = 25  # 'w', dataStart, walEnd, sendTime
_DATA_START: Final = struct.Struct(">Q").unpack_from

#: ``(size, data)`` as ``PGconn.get_copy_data(1)`` returns it.
GetCopyData = Callable[[int], tuple[int, Any]]


def read_copy_python(get: GetCopyData, batch: list[tuple[bytes, int]],
                     limit: int) -> tuple[int, Any]:
    """Append ``(payload, dataStart)`` of the XLogData messages *get* returns to *batch*
    until it holds *limit*, or until a call returns something else: ``(status, message)``
    with the message for :data:`GOT_OTHER` (a keepalive, or a message too short for an
    XLogData header), else None."""
    append = batch.append
    while len(batch) < limit:
        size, data = get(1)
        if size <= 0:
            return (GOT_EMPTY if size == 0 else GOT_END), None
        if data[0] != _XLOG_DATA or len(data) < _HEADER:
            return GOT_OTHER, data
        # tobytes() of a slice, not bytes(): half the cost per message.
        append((data[_HEADER:].tobytes(), _DATA_START(data, 1)[0]))
    return GOT_LIMIT, None


ReadCopy = Callable[[GetCopyData, list[tuple[bytes, int]], int], tuple[int, Any]]

try:
    from tidemark.source.postgres._copy_data import read_copy as _compiled_read_copy
except ImportError:  # not built: the same loop in Python
    _compiled_read_copy = None  # type: ignore[assignment]

#: Whether the compiled loop (``tidemark.source.postgres._copy_data``) is built.
COMPILED_COPY: Final = _compiled_read_copy is not None

#: :func:`read_copy_python`, compiled where built.
read_copy: ReadCopy = (_compiled_read_copy if _compiled_read_copy is not None
                       else read_copy_python)
