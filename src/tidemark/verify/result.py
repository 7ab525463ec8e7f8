"""What a verify found: per table, the rows compared and each differing key."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from tidemark.row_checksum import TableShape

DifferenceKind = Literal["missing", "extra", "different", "duplicate", "column", "checksum"]
RepairState = Literal["applied", "queued", "refused"]


@dataclasses.dataclass(frozen=True)
class Difference:
    """A key whose row differs: ``missing`` (in the source, not the target), ``extra``
    (in the target, not the source), ``different`` (in both, *columns* differ) or
    ``duplicate`` (held by more than one row on a side, *counts* = rows in the source,
    rows in the target). *key* is the key columns' canonical texts (None: NULL).

    Two kinds concern the table, not a key (*key* empty, *detail* says what):
    ``column``, a source column the target does not have, and ``checksum``, buckets
    whose checksums differ although their rows compare equal (a hash collision or a
    fault in one side's checksum: never taken as equal)."""

    kind: DifferenceKind
    key: dict[str, str | None]
    columns: tuple[str, ...] = ()
    target_behind: bool = False
    """The pipeline had not committed the snapshot's position in time: the row may
    have changed in the source since the target last caught up."""
    counts: tuple[int, int] | None = None
    detail: str | None = None

    @property
    def keyed(self) -> bool:
        """True for a difference of one key (a repair can re-read it)."""
        return self.kind in ("missing", "extra", "different")

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "key": self.key}
        if self.columns:
            out["columns"] = list(self.columns)
        if self.counts is not None:
            out["source_rows"], out["target_rows"] = self.counts
        if self.detail is not None:
            out["detail"] = self.detail
        if self.target_behind:
            out["target_behind"] = True
        return out


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """One round of a table's comparison, at its own source position and target version."""

    number: int
    position: str
    """The source position of the round's snapshot (the kind's text of it)."""
    target_version: int
    target_behind: bool
    keys_changed: int
    """Keys changed after the round's position (left out of this round); -1: the table
    was truncated after it, and the round compared nothing."""
    keys_recompared: int
    """Keys left out of an earlier round and compared in this one (0 in the first)."""
    rows_compared: int

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class TableRepair:
    """What ``--repair`` did for one table: the differing keys it asked the pipeline
    to re-read (*keys*, in the signals *signal_ids*), and whether the pipeline has
    applied them (``applied``: the table's result is the verify after), will at its
    next start (``queued``), or repair was refused (*message* says why and what to do
    instead)."""

    state: RepairState
    keys: int = 0
    signal_ids: tuple[str, ...] = ()
    message: str | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "keys": self.keys,
                               "signals": list(self.signal_ids)}
        if self.message is not None:
            out["message"] = self.message
        return out


@dataclasses.dataclass
class TableResult:
    """One target's comparison with its source table."""

    table: str
    path: str
    rows_compared: int = 0
    differences: list[Difference] = dataclasses.field(default_factory=list)
    not_compared: list[dict[str, str | None]] = dataclasses.field(default_factory=list)
    """Keys changed during every round (their rows were never compared)."""
    target_behind: bool = False
    target_version: int | None = None
    rounds: int = 0
    round_results: list[RoundResult] = dataclasses.field(default_factory=list)
    keys_not_compared: int = 0
    """How many keys changed during every round (:attr:`not_compared` names those a
    side still holds)."""
    seconds: float = 0.0
    rows_fetched: int = 0
    """Rows of differing buckets (and of keys compared in later rounds) read from both
    sides."""
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds per phase over all rounds: ``target_open`` (the Delta version read),
    ``changed_keys`` (the keys changed after the snapshot), ``source_sums``,
    ``target_sums`` (bucket sums, the two sides at the same time: each is its side's
    own time) and ``rows`` (the differing buckets' rows; ``source_rows`` and
    ``target_rows`` each side's own time of it)."""
    repair: TableRepair | None = None
    shape: TableShape | None = dataclasses.field(default=None, repr=False, compare=False)
    """What was compared (the key columns' target types name a repair's keys)."""

    @property
    def equal(self) -> bool:
        return not self.differences

    def add_phase(self, phase: str, seconds: float) -> None:
        """Add *seconds* to *phase*."""
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    def as_json(self) -> dict[str, Any]:
        return {"table": self.table, "path": self.path, "equal": self.equal,
                "rows_compared": self.rows_compared,
                "rows_different": len(self.differences),
                "differences": [d.as_json() for d in self.differences],
                "not_compared": self.not_compared, "target_behind": self.target_behind,
                "target_version": self.target_version, "rounds": self.rounds,
                "round_results": [r.as_json() for r in self.round_results],
                "keys_not_compared": self.keys_not_compared,
                "seconds": round(self.seconds, 3), "rows_fetched": self.rows_fetched,
                "phases": _rounded(self.phases),
                **({"repair": self.repair.as_json()} if self.repair is not None else {})}


@dataclasses.dataclass
class VerifyResult:
    """A whole verify: its tables' results, or the error that stopped it."""

    config: str
    tables: list[TableResult] = dataclasses.field(default_factory=list)
    error: str | None = None
    started_at: float = 0.0
    seconds: float = 0.0
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds per phase shared by the tables, over all rounds: ``snapshot`` (opening
    the source snapshots) and ``wait`` (for the pipeline to commit their positions)."""

    @property
    def equal(self) -> bool:
        return self.error is None and all(t.equal for t in self.tables)

    def add_phase(self, phase: str, seconds: float) -> None:
        """Add *seconds* to *phase*."""
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    @property
    def exit_code(self) -> int:
        """0: every target equals its source; 1: differences; 2: an error."""
        if self.error is not None:
            return 2
        return 0 if self.equal else 1

    def as_json(self) -> dict[str, Any]:
        return {"config": self.config, "result": _result_word(self),
                "error": self.error, "started_at": self.started_at,
                "seconds": round(self.seconds, 3), "phases": _rounded(self.phases),
                "tables": [t.as_json() for t in self.tables]}


def _rounded(phases: dict[str, float]) -> dict[str, float]:
    return {name: round(seconds, 3) for name, seconds in phases.items()}


def _result_word(result: VerifyResult) -> str:
    return {0: "equal", 1: "different", 2: "error"}[result.exit_code]
