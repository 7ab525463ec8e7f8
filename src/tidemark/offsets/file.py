"""A JSON file of offsets, replaced atomically on every save."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import msgspec

from tidemark.errors import ConfigError
from tidemark.offsets.store import Offset, decode_json_object


class FileOffsetStore:
    """Offsets of all partitions in one JSON file ``{key: offset}``.

    Each save writes a temporary file in the same directory, fsyncs it and renames it
    over the old one, so the file is always either the old or the new version. A save
    re-reads the file first, so captures sharing one file keep each other's keys
    (each key has a single writer).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._offsets = self._read()
        if not self.path.exists() and not self.path.parent.exists():
            raise ConfigError("offsets", f"directory {self.path.parent} does not exist")

    def _read(self) -> dict[str, Offset]:
        if self.path.exists():
            return decode_json_object(self.path.read_bytes(),
                                      f"{self.path} (not a tidemark offsets file)")
        return {}

    def load(self, key: str) -> Offset | None:
        return self._offsets.get(key)

    def save(self, key: str, offset: Offset) -> None:
        self._offsets = self._read()
        self._offsets[key] = dict(offset)
        data = msgspec.json.encode(self._offsets)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
