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

Several branches of one version can be published together (:func:`publish_branches`):
the executors of ``tidemark run`` merge disjoint key ranges of a batch into one branch
each, and the driver commits them as one. That is only right when no two branches
rewrote the same file, which :func:`publish_branches` checks (:class:`OverlapError`).

Local targets only: hard links and renames need one file system.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
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


class OverlapError(Exception):
    """Two branches of one publish rewrote the same file of the target: their changes
    cannot be put together (the caller applies the batch in one branch instead)."""


def discard_branches(root: Path) -> None:
    """Remove every branch of the target at *root* (left by a crash: a target has one
    writer, so none is in use when a batch starts)."""
    shutil.rmtree(root / BRANCHES_DIR, ignore_errors=True)


def local_directory(uri: str) -> Path | None:
    """The local directory of the table at *uri* (a path, or a ``file://`` URI
    percent-decoded), or None for an object store."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path) if parsed.scheme else uri)
    return None


def local_root(table: DeltaTable) -> Path:
    """The local directory of *table*; raises BranchUnsupportedError for other URIs."""
    root = local_directory(table.table_uri)
    if root is None:
        raise BranchUnsupportedError(f"{table.table_uri} is not on the local file system")
    return root


class Branch:
    """A branch of a target at its current version (see the module docstring).

    With *alone* (the default) every other branch of the target is removed first, as
    left by a crash; the executors that branch one target each for their part of a
    batch pass ``alone=False`` (the driver removed the old ones before they started).
    """

    def __init__(self, target: DeltaTable, name: str, *, alone: bool = True) -> None:
        check_branchable(target)
        self.target = target
        self.target_root = local_root(target)
        self.root = self.target_root / BRANCHES_DIR / name
        self.base_version = target.version()
        if alone:
            discard_branches(self.target_root)
        shutil.rmtree(self.root, ignore_errors=True)  # an earlier try of the same part
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

    @classmethod
    def attach(cls, target: DeltaTable, root: str | Path, base_version: int) -> Branch:
        """The branch at *root* that another process made of *target* at *base_version*
        (to publish it)."""
        branch = cls.__new__(cls)
        branch.target = target
        branch.target_root = local_root(target)
        branch.root = Path(root)
        branch.base_version = base_version
        branch.table = DeltaTable(str(branch.root))
        return branch

    def changes(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """The files the branch's commits added and removed (log paths to actions)."""
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
        return adds, removes

    def publish(self, commit: CommitProperties) -> int:
        """Commit what the branch's commits changed to the target as one transaction;
        returns the target's new version (its current one when nothing changed)."""
        return publish_branches(self.target, [self], commit)

    def discard(self) -> None:
        """Remove the branch (its links and files; the target keeps its own)."""
        shutil.rmtree(self.root, ignore_errors=True)
        with_others = self.root.parent
        if with_others.is_dir() and not any(with_others.iterdir()):
            with_others.rmdir()


def check_branchable(target: DeltaTable) -> None:
    """Raise BranchUnsupportedError if *target* cannot be branched."""
    features = target.protocol().reader_features or []
    if "deletionVectors" in features:
        raise BranchUnsupportedError(f"{target.table_uri} uses deletion vectors")
    local_root(target)


def publish_branches(target: DeltaTable, branches: Sequence[Branch],
                     commit: CommitProperties) -> int:
    """Commit what *branches* (of *target*, all at its current version) changed as one
    transaction and remove them; returns the target's new version (its current one when
    nothing changed). Raises OverlapError, publishing nothing, if two of them removed the
    same file."""
    adds: dict[str, dict[str, Any]] = {}
    removes: dict[str, dict[str, Any]] = {}
    sources: dict[str, Branch] = {}
    for branch in branches:
        if branch.base_version != target.version():
            raise OverlapError(f"{target.table_uri} is at version {target.version()}, "
                               f"the branch {branch.root.name} of version "
                               f"{branch.base_version}")
        added, removed = branch.changes()
        both = removes.keys() & removed.keys()
        if both:
            raise OverlapError(f"{len(both)} file(s) of {target.table_uri} were rewritten "
                               f"by more than one branch, e.g. {min(both)}")
        removes.update(removed)
        adds.update(added)
        sources.update(dict.fromkeys(added, branch))
    if not adds and not removes:
        for branch in branches:
            branch.discard()
        return target.version()
    actions: list[AddAction | RemoveAction] = []
    root = local_root(target)
    for path, add in adds.items():
        # Log paths are URI-encoded; the file's name on disk is the decoded path,
        # and create_write_transaction encodes what it is given.
        name = unquote(path)
        destination = root / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.rename(sources[path].root / name, destination)
        actions.append(AddAction(name, int(add["size"]), add.get("partitionValues") or {},
                                 int(add["modificationTime"]), True, add.get("stats") or ""))
    now_ms = int(time.time() * 1000)
    actions += [RemoveAction(unquote(path), True, now_ms, remove.get("size"),
                             remove.get("partitionValues"))
                for path, remove in removes.items()]
    partition_by = list(target.metadata().partition_columns) or None
    target.create_write_transaction(actions, mode="append", schema=target.schema(),
                                    partition_by=partition_by, commit_properties=commit)
    target.update_incremental()
    log.debug("published %d added and %d removed file(s) from %d branch(es) to %s as "
              "version %d", len(adds), len(removes), len(branches), root, target.version())
    for branch in branches:
        branch.discard()
    return target.version()
