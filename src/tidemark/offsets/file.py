"""A JSON file of offsets, replaced atomically on every save."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import msgspec

from tidemark.atomic_file import write_atomically
from tidemark.errors import ConfigError
from tidemark.offsets.store import Offset, decode_json_object, show_json


class FileOffsetStore:
    """Offsets of all partitions in one JSON file ``{key: offset}``.

    Each save writes a temporary file in the same directory, fsyncs it and renames it
    over the old one, so the file is always either the old or the new version. A save
    re-reads the file first, so captures sharing one file keep each other's keys
    (each key has a single writer); a lock on the file's directory keeps two saves from
    reading the same version and one writing over the other's key.

    The constructor fails (:class:`~tidemark.errors.ConfigError`, key ``offsets``) on a
    file that is not ``{key: object}`` or a directory where no file can be created, so
    that a capture finds out before it has done anything worth saving.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ConfigError("offsets", f"{self.path} is a directory; give a file path")
        self._offsets = self._read()
        if not self.path.exists():
            if not self.path.parent.exists():
                raise ConfigError("offsets", f"directory {self.path.parent} does not exist")
            if not self.path.parent.is_dir():
                raise ConfigError("offsets", f"{self.path.parent} is not a directory; the "
                                  "offsets file must be in a writable directory")
        self._check_writable()

    def __str__(self) -> str:
        return f"offsets file {self.path}"

    def _check_writable(self) -> None:
        # Every save creates a temporary file beside the offsets file and renames it, so
        # the directory must take new files; try one now rather than at the first save.
        directory = self.path.parent
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
        except OSError as err:
            raise ConfigError(
                "offsets", f"cannot create files in {directory} ({err.strerror}); the "
                "offsets file is replaced through a new file beside it, so its directory "
                "must be writable") from None
        os.close(fd)
        os.unlink(tmp)

    def _read(self) -> dict[str, Offset]:
        if not self.path.exists():
            return {}
        what = f"{self.path} (not a tidemark offsets file)"
        try:
            data = self.path.read_bytes()
        except OSError as err:
            raise ConfigError("offsets", f"cannot read {self.path} ({err.strerror})") from None
        offsets = decode_json_object(data, what)
        for key, offset in offsets.items():
            if not isinstance(offset, dict):
                raise ConfigError(
                    "offsets", f"{what}: key {key!r} holds {show_json(offset)}; each key "
                    "must hold an offset, a JSON object")
        return offsets

    def load(self, key: str) -> Offset | None:
        return self._offsets.get(key)

    def save(self, key: str, offset: Offset) -> None:
        self.save_many({key: offset})

    def load_many(self, keys: Sequence[str]) -> dict[str, Offset]:
        return {k: self._offsets[k] for k in keys if k in self._offsets}

    def save_many(self, offsets: Mapping[str, Offset]) -> None:
        with self._locked():
            self._offsets = self._read()
            self._offsets.update((key, dict(offset)) for key, offset in offsets.items())
            write_atomically(self.path, msgspec.json.encode(self._offsets))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive between processes and threads (each open is a lock of its own). The
        directory, not the file: the file is replaced by every save, and a lock file
        would be one more file for users to wonder about."""
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock
