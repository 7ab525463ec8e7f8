"""What a verify found: per table, the rows compared and each differing key."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

DifferenceKind = Literal["missing", "extra", "different"]


@dataclasses.dataclass(frozen=True)
class Difference:
    """A key whose row differs: ``missing`` (in the source, not the target), ``extra``
    (in the target, not the source) or ``different`` (in both, *columns* differ).
    *key* is the key columns' canonical texts (None: NULL)."""

    kind: DifferenceKind
    key: dict[str, str | None]
    columns: tuple[str, ...] = ()
    target_behind: bool = False
    """The pipeline had not committed the snapshot's position in time: the row may
    have changed in the source since the target last caught up."""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "key": self.key}
        if self.columns:
            out["columns"] = list(self.columns)
        if self.target_behind:
            out["target_behind"] = True
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
    seconds: float = 0.0
    rows_fetched: int = 0
    """Rows of differing buckets (and of keys compared in later rounds) read from both
    sides."""
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds per phase over all rounds: ``target_open`` (the Delta version read),
    ``changed_keys`` (the keys changed after the snapshot), ``source_sums``,
    ``target_sums`` (bucket sums) and ``rows`` (the differing buckets' rows)."""

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
                "seconds": round(self.seconds, 3), "rows_fetched": self.rows_fetched,
                "phases": _rounded(self.phases)}


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
