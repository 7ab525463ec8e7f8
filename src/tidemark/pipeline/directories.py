"""The local directories a ``tidemark run`` start makes (its checkpoint, its targets'),
checked before anything is made and removed again when that start fails.

A start first asks whether each directory *could* be made (:func:`cannot_create`), and
checks the source, before making any: a start refused for a setting, an unreachable
server or a missing SQLite file leaves nothing behind. Whatever a later step of the
start then refuses (Spark, the source's stream) is undone by
:meth:`MadeDirectories.remove`: only directories this start made, which did not exist
before it and so hold nothing an earlier run wrote.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

from tidemark.errors import ConfigError

log = logging.getLogger(__name__)


def cannot_create(path: Path) -> str | None:
    """Why the directory *path* cannot be made (or used, if it exists), naming the part
    in the way; None if it can. Nothing is made."""
    if path.exists():
        if not path.is_dir():
            return f"{os.strerror(errno.ENOTDIR)} ({path} is a file)"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{os.strerror(errno.EACCES)} ({path} is not writable)"
        return None
    for parent in path.parents:
        if not parent.exists():
            continue
        if not parent.is_dir():
            return f"{os.strerror(errno.ENOTDIR)} ({parent} is a file)"
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"{os.strerror(errno.EACCES)} (in {parent})"
        return None
    return None


class MadeDirectories:
    """The directories one start made, outermost first, to remove if it fails."""

    def __init__(self) -> None:
        self._made: list[Path] = []

    def make(self, path: str, key: str) -> None:
        """Make the directory *path* (and its missing parents), remembering the
        outermost one that did not exist; raise ConfigError naming *key* if it cannot."""
        target = Path(path)
        missing = [p for p in (target, *target.parents) if not p.exists()]
        try:
            os.makedirs(target, exist_ok=True)
        except OSError as err:
            raise ConfigError(key, f"cannot create {target}: "
                                   f"{cannot_create(target) or err.strerror or err}") from None
        if missing:
            self._made.append(missing[-1])

    def remove(self) -> list[str]:
        """Remove every directory :meth:`make` made, with what is in it (this start's
        files only: it did not exist before); returns the removed paths."""
        removed: list[str] = []
        made, self._made = self._made, []
        for path in reversed(made):
            try:
                shutil.rmtree(path)
            except FileNotFoundError:
                continue
            except OSError as err:  # the start's own failure is what the user must see
                log.warning("could not remove %s, which the failed start made: %s",
                            path, err)
                continue
            removed.append(str(path))
        return removed
