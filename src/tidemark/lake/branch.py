"""A private copy of a local Delta table that several commits go into, published as one.

A source transaction is atomic, so its changes must reach a Delta table in one commit: a
reader may never see part of a bulk load. But a transaction can be far bigger than what
one merge should hold in memory (a 10M-row ``INSERT … SELECT``), and every delta-rs
merge commits. So a big batch is merged in steps into a *branch*: a Delta table in
``<target>/_tidemark_branches/<name>`` whose log starts as a copy of the target's and
whose data files are hard links to the target's (no data is copied). Each step's merge
commits to the branch only. :meth:`Branch.publish` then reads what the branch's commits
added and removed, moves the added files into the target and commits those adds and
removes to the target as one transaction (``DeltaTable.create_write_transaction``),
carrying the batch's app transaction, so the replay of a crashed batch is still
recognised.

A crash before the publish leaves only the branch directory (Delta readers and ``vacuum``
skip ``_``-prefixed directories); the next branch of the target removes it. A crash
after the files were moved but before the commit leaves unreferenced files, which
``vacuum`` removes. tidemark is the target's only writer (one pipeline per target), which
is what makes a branch of the current version safe to publish.

Local targets only: hard links and renames need one file system.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlparse

from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import AddAction, RemoveAction

log = logging.getLogger(__name__)

#: The directory, inside the target, that holds its branches.
BRANCHES_DIR: Final = "_tidemark_branches"


class BranchUnsupportedError(Exception):
    """The target cannot be branched (not on the local file system, or it has
    deletion vectors, whose files a branch would not carry)."""


def local_root(table: DeltaTable) -> Path:
    """The local directory of *table*; raises BranchUnsupportedError for other URIs."""
    uri = table.table_uri
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path) if parsed.scheme else uri)
    raise BranchUnsupportedError(f"{uri} is not on the local file system")


class Branch:
    """A branch of a target at its current version (see the module docstring)."""

    def __init__(self, target: DeltaTable, name: str) -> None:
        features = target.protocol().reader_features or []
        if "deletionVectors" in features:
            raise BranchUnsupportedError(f"{target.table_uri} uses deletion vectors")
        self.target = target
        self.target_root = local_root(target)
        self.root = self.target_root / BRANCHES_DIR / name
        self.base_version = target.version()
        branches = self.target_root / BRANCHES_DIR
        # Left by a crash: a target has one writer, so no other branch is in use.
        shutil.rmtree(branches, ignore_errors=True)
        self.root.mkdir(parents=True)
        linked = 0
        try:
            shutil.copytree(self.target_root / "_delta_log", self.root / "_delta_log")
            for uri in target.file_uris():
                source = Path(unquote(urlparse(uri).path)) if "://" in uri else Path(uri)
                relative = source.relative_to(self.target_root)
                (self.root / relative).parent.mkdir(parents=True, exist_ok=True)
                os.link(source, self.root / relative)
                linked += 1
        except (ValueError, OSError) as err:  # a file outside the table, another device
            self.discard()
            raise BranchUnsupportedError(f"cannot link {self.target_root}'s files into a "
                                         f"branch: {err}") from err
        self.table = DeltaTable(str(self.root))
        log.debug("branched %s at version %d (%d files linked)", self.target_root,
                  self.base_version, linked)

    def publish(self, commit: CommitProperties) -> int:
        """Commit what the branch's commits changed to the target as one transaction;
        returns the target's new version (its current one when nothing changed)."""
        self.table.update_incremental()
        adds: dict[str, dict[str, Any]] = {}
        removes: dict[str, dict[str, Any]] = {}
        for version in range(self.base_version + 1, self.table.version() + 1):
            log_file = self.root / "_delta_log" / f"{version:020d}.json"
            for line in log_file.read_text(encoding="utf-8").splitlines():
                action = json.loads(line)
                if "add" in action:
                    adds[action["add"]["path"]] = action["add"]
                elif "remove" in action:
                    path = action["remove"]["path"]
                    # A file one step wrote and a later step rewrote never existed for
                    # the target.
                    if adds.pop(path, None) is None:
                        removes[path] = action["remove"]
        if not adds and not removes:
            self.discard()
            return self.target.version()
        actions: list[AddAction | RemoveAction] = []
        for path, add in adds.items():
            # Log paths are URI-encoded; the file's name on disk is the decoded path,
            # and create_write_transaction encodes what it is given.
            name = unquote(path)
            destination = self.target_root / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.rename(self.root / name, destination)
            actions.append(AddAction(name, int(add["size"]), add.get("partitionValues") or {},
                                     int(add["modificationTime"]), True, add.get("stats") or ""))
        now_ms = int(time.time() * 1000)
        actions += [RemoveAction(unquote(path), True, now_ms, remove.get("size"),
                                 remove.get("partitionValues"))
                    for path, remove in removes.items()]
        partition_by = list(self.target.metadata().partition_columns) or None
        self.target.create_write_transaction(actions, mode="append",
                                             schema=self.target.schema(),
                                             partition_by=partition_by,
                                             commit_properties=commit)
        self.target.update_incremental()
        log.debug("published %d added and %d removed file(s) to %s as version %d",
                  len(adds), len(removes), self.target_root, self.target.version())
        self.discard()
        return self.target.version()

    def discard(self) -> None:
        """Remove the branch (its links and files; the target keeps its own)."""
        shutil.rmtree(self.root, ignore_errors=True)
        with_others = self.root.parent
        if with_others.is_dir() and not any(with_others.iterdir()):
            with_others.rmdir()
