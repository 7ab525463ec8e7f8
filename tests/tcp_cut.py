"""A TCP relay whose connections can be cut the way a network failure cuts them: the
client's side closes, the server's side stays open and silent, so the server keeps its
backend (a walsender stays active) until its own timeout notices.

The relay runs in a process of its own (:class:`CuttableRelay`): libpq's blocking
connect may hold the GIL, which would starve a relay thread of the same process."""

from __future__ import annotations

import contextlib
import selectors
import socket
import subprocess
import sys
import threading
from types import TracebackType


class _Relay:
    """Relays 127.0.0.1:<port> to *host*:*port*; :meth:`cut` breaks every connection
    open now (new ones are relayed as before)."""

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self._kept: list[socket.socket] = []  # server sides of cut connections
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="relay-accept").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._upstream)
            except OSError:
                client.close()
                continue
            cut = threading.Event()
            with self._lock:
                self._pairs.append((client, server, cut))
            threading.Thread(target=self._pump, args=(client, server, cut), daemon=True,
                             name="relay-pump").start()

    def _pump(self, client: socket.socket, server: socket.socket,
              cut: threading.Event) -> None:
        other = {client: server, server: client}
        with selectors.DefaultSelector() as sel:
            sel.register(client, selectors.EVENT_READ)
            sel.register(server, selectors.EVENT_READ)
            while not cut.is_set():
                for key, _ in sel.select(0.05):
                    if cut.is_set():
                        break
                    sock: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = sock.recv(65536)
                        if data:
                            other[sock].sendall(data)
                            continue
                    except OSError:
                        pass
                    # One side ended: end both (an ordinary close, not a cut).
                    for s in (client, server):
                        with contextlib.suppress(OSError):
                            s.close()
                    return

    def cut(self) -> int:
        """Break every open connection: the client sees it reset, the server sees
        nothing (its side stays open, unread). Returns how many were cut."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, server, cut in pairs:
            cut.set()
            with contextlib.suppress(OSError):
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                  b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
                client.close()
            self._kept.append(server)
        return len(pairs)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, server, cut in pairs:
            cut.set()
            for s in (client, server):
                with contextlib.suppress(OSError):
                    s.close()
        for s in self._kept:
            with contextlib.suppress(OSError):
                s.close()



class CuttableRelay:
    """A :class:`_Relay` in a child process, relaying to *host*:*port*."""

    def __init__(self, host: str, port: int) -> None:
        self._proc = subprocess.Popen([sys.executable, __file__, host, str(port)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True)
        assert self._proc.stdout is not None
        self.port = int(self._proc.stdout.readline())

    def dsn(self, dsn: str) -> str:
        """*dsn* pointed at this relay."""
        from psycopg.conninfo import make_conninfo  # noqa: PLC0415 - test helper

        return make_conninfo(dsn, host="127.0.0.1", port=str(self.port))

    def cut(self) -> int:
        """Break every connection open now (see :meth:`_Relay.cut`); how many."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write("cut\n")
        self._proc.stdin.flush()
        return int(self._proc.stdout.readline())

    def close(self) -> None:
        self._proc.kill()
        self._proc.wait()

    def __enter__(self) -> CuttableRelay:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


if __name__ == "__main__":
    relay = _Relay(sys.argv[1], int(sys.argv[2]))
    print(relay.port, flush=True)
    for command in sys.stdin:
        if command.strip() == "cut":
            print(relay.cut(), flush=True)
    relay.close()
