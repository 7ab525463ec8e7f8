"""A verify's result as text lines (one per differing key) or JSON."""

from __future__ import annotations

import json

from tidemark.verify.result import Difference, TableRepair, TableResult, VerifyResult


def key_text(key: dict[str, str | None]) -> str:
    """``id=7`` or ``a=1, b=x`` (NULL for a null key column)."""
    return ", ".join(f"{name}={'NULL' if value is None else value}"
                     for name, value in key.items())


def difference_line(difference: Difference) -> str:
    """``missing id=7``, ``extra id=9``, ``different id=3 (v, n)``,
    ``duplicate id=2 (1 row in the source, 2 in the target)``, ``column v: ...``."""
    if not difference.key:
        line = f"{difference.kind}: {difference.detail}"
    else:
        line = f"{difference.kind} {key_text(difference.key)}"
    if difference.columns:
        line += f" ({', '.join(difference.columns)})"
    if difference.counts is not None:
        in_source, in_target = difference.counts
        line += (f" ({in_source} row{'s' if in_source != 1 else ''} in the source, "
                 f"{in_target} in the target)")
    if difference.target_behind:
        line += " [target behind]"
    return line


def repair_line(repair: TableRepair) -> str:
    """What ``--repair`` did for a table, in a line."""
    keys = f"{repair.keys} key{'s' if repair.keys != 1 else ''}"
    if repair.state == "applied":
        return (f"repaired {keys} (re-read from the source by the pipeline, "
                f"{len(repair.signal_ids)} signal(s)); the result above is the verify after")
    if repair.state == "queued":
        return f"repair of {keys} queued: {repair.message}"
    return f"repair refused: {repair.message}"


def table_lines(table: TableResult) -> list[str]:
    """A table's summary line, then one line per difference."""
    verdict = "equal" if table.equal else f"{len(table.differences)} rows differ"
    rounds = f" in {table.rounds} rounds" if table.rounds > 1 else ""
    head = (f"{table.table}: {verdict} ({table.rows_compared} rows compared{rounds}, "
            f"Delta version {table.target_version}, {table.seconds:.1f} s)")
    if table.target_behind and not table.equal:
        head += "; the pipeline had not caught up with the source (target behind)"
    lines = [head, *(f"  {difference_line(d)}" for d in table.differences)]
    lines += [f"  not compared (changed during every round) {key_text(k)}"
              for k in table.not_compared]
    gone = table.keys_not_compared - len(table.not_compared)
    if gone > 0:
        lines.append(f"  not compared (changed during every round): {gone} more keys "
                     "that neither side holds now")
    if table.repair is not None:
        lines.append(f"  {repair_line(table.repair)}")
    return lines


def text_report(result: VerifyResult) -> list[str]:
    """The whole report as lines."""
    lines = [line for table in result.tables if table.rounds or table.differences
             for line in table_lines(table)]
    if result.error is not None:
        # What was compared before the error still helps (a lagging pipeline's rows).
        return [*lines, f"verify failed: {result.error}"]
    return lines or ["no targets to verify"]


def json_report(result: VerifyResult) -> str:
    """The whole report as one JSON document."""
    return json.dumps(result.as_json(), indent=2)
