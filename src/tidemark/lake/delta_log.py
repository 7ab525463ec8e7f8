"""Replay of a local Delta table's ``_delta_log`` and exclusive commits to it.

delta-rs does not expose the deletion vector descriptors of the live files, and
merge-on-read needs them (a new DV replaces the old one by a remove of (path, old DV) and
an add of (path, new DV)). :func:`read_log` replays the last classic checkpoint and the
JSON commits after it into the live add actions, as the protocol's "Action
Reconciliation" says; :func:`advance` brings such a state up to date from the newer
commits only; :func:`commit` writes the next version put-if-absent (a hard link fails
when the version exists), so two writers never both win a version.

Only local tables: the caller refuses object stores before it gets here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tidemark.errors import TerminalError, TransientError
from tidemark.lake.deletion_vector import DeletionVector

__all__ = [
    "CommitConflictError",
    "CommitFile",
    "LogState",
    "UnsupportedLogError",
    "advance",
    "commit",
    "commit_file",
    "now_ms",
    "num_records",
    "read_log",
    "replace_file_actions",
]

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CLASSIC = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_MULTI = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_V2 = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(json|parquet)$")


class CommitConflictError(TransientError):
    """Another writer committed the version first: re-read the log and try again."""

    def __init__(self, version: int) -> None:
        super().__init__(
            f"Delta log version {version} already exists: another writer committed it "
            "first; re-read the table and retry at the next version"
        )
        self.version = version


class UnsupportedLogError(TerminalError):
    """The table's log uses a layout this replay does not read (v2 checkpoints)."""


@dataclasses.dataclass
class LogState:
    """The live files of a Delta table at ``version``.

    ``files`` maps each live file's path, as written in its add action, to that add
    action's JSON object (``deletionVector`` included when the file has one).
    """

    version: int
    files: dict[str, dict[str, Any]]
    protocol: dict[str, Any]
    metadata: dict[str, Any]
    commit: CommitFile | None = None
    """The commit file of ``version`` as it was read (None: not read from one)."""


@dataclasses.dataclass(frozen=True)
class CommitFile:
    """Which file a version's commit is: a table deleted and made again at the same
    path, or a log rewritten under a reader, has other files at the same names."""

    version: int
    device: int
    inode: int
    size: int
    mtime_ns: int


def commit_file(root: Path, version: int) -> CommitFile | None:
    """The commit file of *version* in the local table *root* (None: there is none)."""
    try:
        stat = os.stat(_commit_path(root, version))
    except OSError:
        return None
    return CommitFile(version, stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def now_ms() -> int:
    """Milliseconds since the epoch, the Delta log's timestamps."""
    return time.time_ns() // 1_000_000


def _log_dir(root: Path) -> Path:
    return Path(root) / "_delta_log"


def _commit_path(root: Path, version: int) -> Path:
    return _log_dir(root) / f"{version:020d}.json"


# --- replay -------------------------------------------------------------------------


def _dv_id(action: Mapping[str, Any]) -> str | None:
    dv = action.get("deletionVector")
    return None if dv is None else DeletionVector.from_json(dv).unique_id


def _apply(state: LogState, actions: Iterable[Mapping[str, Any]]) -> None:
    """Reconciles one commit's actions into *state*.

    A logical file is (path, DV unique id): a remove drops the live file only when both
    match, so the remove of (path, old DV) and the add of (path, new DV) in one commit
    leave the new one live whatever their order. Removes go first for the same reason.
    """
    adds: list[dict[str, Any]] = []
    for action in actions:
        if "add" in action:
            # A JSON null is an absent field (delta-rs writes "tags": null and the like).
            adds.append({k: v for k, v in action["add"].items() if v is not None})
        elif "remove" in action:
            remove = action["remove"]
            live = state.files.get(remove["path"])
            if live is not None and _dv_id(live) == _dv_id(remove):
                del state.files[remove["path"]]
        elif "protocol" in action:
            state.protocol = dict(action["protocol"])
        elif "metaData" in action:
            state.metadata = dict(action["metaData"])
    for add in adds:
        state.files[add["path"]] = add


def _read_commit(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as source:
        return [json.loads(line) for line in source if line.strip()]


def _listing(root: Path) -> tuple[set[int], dict[int, list[Path]], set[int]]:
    """Commit versions, complete classic checkpoints (version -> parts), v2 versions."""
    log = _log_dir(root)
    try:
        names = os.listdir(log)
    except FileNotFoundError:
        raise FileNotFoundError(f"{root} is not a Delta table: {log} does not exist") from None
    commits: set[int] = set()
    parts: dict[tuple[int, int], list[tuple[int, Path]]] = {}
    v2: set[int] = set()
    for name in names:
        if m := _COMMIT.match(name):
            commits.add(int(m[1]))
        elif m := _CLASSIC.match(name):
            parts.setdefault((int(m[1]), 1), []).append((1, log / name))
        elif m := _MULTI.match(name):
            parts.setdefault((int(m[1]), int(m[3])), []).append((int(m[2]), log / name))
        elif m := _V2.match(name):
            v2.add(int(m[1]))
    checkpoints: dict[int, list[Path]] = {}
    for (version, count), found in parts.items():
        if len(found) == count:  # a multi-part checkpoint still being written is skipped
            checkpoints[version] = [p for _, p in sorted(found)]
    return commits, checkpoints, v2


def _plain(value: Any, type_: pa.DataType) -> Any:
    """A checkpoint value as the log's JSON has it: maps as objects, no null fields."""
    if value is None:
        return None
    if pa.types.is_map(type_):
        return {k: _plain(v, type_.item_type) for k, v in value}
    if pa.types.is_struct(type_):
        out = {}
        for field in type_:
            item = _plain(value.get(field.name), field.type)
            if item is not None:
                out[field.name] = item
        return out
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        return [_plain(v, type_.value_type) for v in value]
    return value


def _read_checkpoint(paths: Sequence[Path], version: int) -> list[dict[str, Any]]:
    actions: list[dict[str, Any]] = []
    for path in paths:
        schema = pq.read_schema(path)
        for column in ("sidecar", "checkpointMetadata"):
            if column in schema.names and pq.read_table(path, columns=[column])[column] \
                    .null_count != pq.ParquetFile(path).metadata.num_rows:
                raise UnsupportedLogError(
                    f"checkpoint {path} has {column} actions (a v2 checkpoint): this "
                    "table layout is not supported for merge-on-read; write the table "
                    "with classic checkpoints (delta-rs create_checkpoint) instead"
                )
        wanted = [c for c in ("add", "protocol", "metaData") if c in schema.names]
        table = pq.read_table(path, columns=wanted)
        for name in wanted:
            column = table[name]
            # stats_parsed / partitionValues_parsed repeat what the JSON fields say.
            type_ = column.type
            for value in column.to_pylist():
                if value is not None:
                    plain = _plain(value, type_)
                    for extra in ("stats_parsed", "partitionValues_parsed"):
                        plain.pop(extra, None)
                    actions.append({name: plain})
    if not any("protocol" in a for a in actions) or not any("metaData" in a for a in actions):
        raise ValueError(f"checkpoint of version {version} lacks its protocol or metaData")
    return actions


def read_log(root: Path, version: int | None = None) -> LogState:
    """The live files of the Delta table at *root* at *version* (default: the latest)."""
    commits, checkpoints, v2 = _listing(root)
    latest = max(commits | set(checkpoints) | v2, default=-1)
    if latest < 0:
        raise FileNotFoundError(f"{_log_dir(root)} holds no Delta commits")
    target = latest if version is None else version
    if target > latest:
        raise ValueError(f"Delta table {root} has no version {target}; its latest is {latest}")
    base = max((v for v in checkpoints if v <= target), default=-1)
    newer_v2 = max((v for v in v2 if v <= target), default=-1)
    if newer_v2 > base:
        raise UnsupportedLogError(
            f"Delta table {root} has a v2 (UUID-named) checkpoint at version {newer_v2}: "
            "this table layout is not supported for merge-on-read; use classic checkpoints"
        )
    state = LogState(version=base, files={}, protocol={}, metadata={})
    if base >= 0:
        _apply(state, _read_checkpoint(checkpoints[base], base))
    for v in range(base + 1, target + 1):
        if v not in commits:
            raise FileNotFoundError(
                f"Delta table {root} lacks commit {_commit_path(root, v).name} needed to "
                f"read version {target} (log cleaned up with no checkpoint before it?)"
            )
        _apply(state, _read_commit(_commit_path(root, v)))
        state.version = v
    state.commit = commit_file(root, state.version)
    return state


def _last_checkpoint_version(root: Path) -> int:
    try:
        with open(_log_dir(root) / "_last_checkpoint", encoding="utf-8") as source:
            return int(json.load(source)["version"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def advance(root: Path, state: LogState) -> LogState:
    """*state* brought to the latest version from the JSON commits after it.

    Returns a new state (*state* is left as it was). When the next commit is gone but a
    newer checkpoint exists (log cleanup), it replays from that checkpoint instead; when
    *state*'s own commit is no longer the file it was read from (the table was made
    again at the same path), it replays the table afresh: the newer commits would not
    follow it.
    """
    if state.commit is not None and commit_file(root, state.version) != state.commit:
        return read_log(root)
    new = LogState(state.version, dict(state.files), state.protocol, state.metadata,
                   state.commit)
    while True:
        try:
            actions = _read_commit(_commit_path(root, new.version + 1))
        except FileNotFoundError:
            if _last_checkpoint_version(root) > new.version:
                return read_log(root)
            return new
        _apply(new, actions)
        new.version += 1
        new.commit = commit_file(root, new.version)


# --- commits ------------------------------------------------------------------------


def commit(root: Path, version: int, actions: Sequence[Mapping[str, Any]]) -> None:
    """Writes *actions* as Delta log *version*, failing if any writer already wrote it.

    Put-if-absent on a local file system: the commit is written and fsynced under a
    temporary name, then hard-linked to its final name (``link`` fails when the name
    exists), so readers see a whole commit or none. Raises :class:`CommitConflictError`.
    """
    log = _log_dir(root)
    final = _commit_path(root, version)
    tmp = log / f".{final.name}.{uuid.uuid4().hex}.tmp"
    body = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)
    try:
        with open(tmp, "x", encoding="utf-8") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, final)
        except FileExistsError:
            raise CommitConflictError(version) from None
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(log, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def num_records(add: Mapping[str, Any]) -> int | None:
    """The row count the statistics of the add action *add* give (None: none)."""
    stats = add.get("stats")
    if not stats:
        return None
    records = json.loads(stats).get("numRecords")
    return int(records) if records is not None else None


def replace_file_actions(add: Mapping[str, Any], dv: DeletionVector | None,
                         now: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The remove of the live file *add* and the add of the same file with *dv*.

    The remove carries no statistics (optional there, and a merge-on-read batch removes
    and re-adds every file it marks: they were half of each commit's bytes).

    The new add keeps path, size, partition values, modification time and the other
    fields of *add*; its stats keep ``numRecords`` (the protocol requires the physical
    count) and say ``"tightBounds": false``, as min/max may now cover deleted rows.
    With ``dv`` None the new add has no deletion vector.
    """
    remove: dict[str, Any] = {
        "path": add["path"],
        "deletionTimestamp": now,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": dict(add.get("partitionValues") or {}),
        "size": add["size"],
    }
    if add.get("deletionVector") is not None:
        remove["deletionVector"] = dict(add["deletionVector"])
    new_add = {k: v for k, v in add.items() if k != "deletionVector"}
    new_add["dataChange"] = True
    if dv is not None:
        new_add["deletionVector"] = dv.to_json()
        if add.get("stats"):
            stats = json.loads(add["stats"])
            stats["tightBounds"] = False
            new_add["stats"] = json.dumps(stats, separators=(",", ":"))
    return {"remove": remove}, {"add": new_add}
