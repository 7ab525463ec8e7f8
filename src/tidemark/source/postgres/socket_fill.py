"""Waiting for a replication socket to hold a worthwhile read (:class:`SocketFill`).

The walsender sends each message as soon as it is decoded. A client that keeps up with
it finds one message at a time in its socket, and reading them one by one (a syscall
and a trip through libpq each) cost a reader more CPU than decoding them: on 300k
changes, up to 210k socket reads and 1.1 s of CPU, against 5k reads and 0.3 s when each
read waits for a few kilobytes. The faster the rest of ``tidemark capture`` became, the
more of its CPU went there (0.7-1.3 s per 300k changes, varying with how far ahead of
the walsender it ran; 0.7-0.8 s with these waits). Mid-batch only, so the first
message of a batch is never held back, and for at most a couple of milliseconds.
"""

from __future__ import annotations

import logging
import os
import select
import socket
from typing import Final

log = logging.getLogger(__name__)

#: Bytes a mid-batch read waits for: about half of libpq's 16 kB input buffer, which
#: one read fills at most.
FILL_BYTES: Final = 8192


class SocketFill:
    """Waits until the socket *fd* holds :data:`FILL_BYTES` (or a timeout passes).

    Through ``SO_RCVLOWAT`` on a duplicate of the descriptor (the same socket), set only
    for the wait: ``select`` elsewhere must still wake on the first byte. Where the
    option is not supported, :meth:`wait` waits for the first byte only.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._sock: socket.socket | None = socket.socket(fileno=os.dup(fd))
        self._lowat = True

    def wait(self, timeout_s: float) -> None:
        """Return once the socket holds FILL_BYTES, or after *timeout_s*."""
        sock = self._sock
        if sock is None:
            raise ValueError("SocketFill is closed")
        if not self._lowat:
            select.select([self._fd], [], [], timeout_s)
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, FILL_BYTES)
        except OSError as err:
            log.debug("SO_RCVLOWAT not supported (%s): reads are not batched", err)
            self._lowat = False
            return
        try:
            select.select([self._fd], [], [], timeout_s)
        finally:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)

    def close(self) -> None:
        """Close the duplicate descriptor (the connection's stays open)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
