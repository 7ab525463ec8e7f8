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
    """The directories one start made, outermost first, to remove if it fails.

    Only a directory this start's own ``mkdir`` created counts as made: another start
    running at the same time may create, and write in, a shared parent. So the leaf a
    start asked for goes with what is in it (its own files), a parent only if empty.
    """

    def __init__(self) -> None:
        self._made: list[tuple[Path, bool]] = []  # (directory, whether a leaf)

    def make(self, path: str, key: str) -> None:
        """Make the directory *path* and its missing parents, one level at a time,
        remembering each that this call created; raise ConfigError naming *key* if it
        cannot."""
        target = Path(path)
        for level in (*reversed(target.parents), target):
            if level.is_dir():
                continue
            try:
                os.mkdir(level)
            except FileExistsError:
                continue  # made meanwhile by someone else (or a file: the next level says)
            except OSError as err:
                raise ConfigError(key, f"cannot create {target}: "
                                       f"{cannot_create(target) or err.strerror or err}"
                                  ) from None
            self._made.append((level, level == target))
        if not target.is_dir():
            raise ConfigError(key, f"cannot create {target}: "
                                   f"{cannot_create(target) or 'not a directory'}")

    def remove(self, *, only_empty: bool = False) -> list[str]:
        """Remove the directories :meth:`make` made, innermost first: a leaf with what
        is in it (this start's files: it did not exist before), a parent only if it is
        empty; with *only_empty*, a leaf too only if empty (a run that planned a batch
        wrote what a restart needs). Returns the removed paths."""
        removed: list[str] = []
        made, self._made = self._made, []
        for path, leaf in reversed(made):
            try:
                if leaf and not only_empty:
                    shutil.rmtree(path)
                else:
                    os.rmdir(path)
            except FileNotFoundError:
                continue
            except OSError as err:
                if (only_empty or not leaf) and err.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    if not only_empty:
                        log.info("kept %s, which the failed start made: something else "
                                 "was written in it since", path)
                    continue
                # The start's own failure is what the user must see.
                log.warning("could not remove %s, which the failed start made: %s",
                            path, err)
                continue
            removed.append(str(path))
        return removed
