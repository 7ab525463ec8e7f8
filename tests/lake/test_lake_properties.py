"""Property: random transactions over a few keys, split into random batches and applied in
order (with replays of earlier batches) give the same table as applying the changes one
at a time to a Python dict (SCD1), and the same version history as a per-transaction
model (SCD2) — also when each batch is applied in pieces cut anywhere, even inside a
transaction (``apply_changes_in_steps``), which must still make one commit per batch."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lake_helpers import change, read, rows
from tidemark.lake import ApplySpec, apply_changes
from tidemark.lake.delta_writer import apply_changes_in_steps

KEYS = (1, 2, 3, 4)
Txn = list[dict[str, Any]]


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Txn], list[int], list[tuple[int, str]]]:
    """Valid transactions (as PostgreSQL would log them), batch sizes and replays."""
    state: dict[int, dict[str, Any]] = {}
    txns: list[Txn] = []
    for t in range(draw(st.integers(1, 12))):
        lsn = 10 * (t + 1)
        txn: Txn = []
        for seq in range(1, draw(st.integers(1, 4)) + 1):
            kind = draw(st.sampled_from(["write", "write", "write", "delete", "pk", "truncate"]))
            key = draw(st.sampled_from(KEYS))
            name = draw(st.sampled_from(["a", "b", None]))
            if kind == "truncate" and draw(st.booleans()):
                txn.append(change("t", lsn, seq))
                state.clear()
            elif kind == "delete" and key in state:
                txn.append(change("d", lsn, seq, id=key))
                del state[key]
            elif kind == "pk" and key in state and (new := key + 10) not in state:
                txn.append(change("d", lsn, seq, id=key))
                txn.append(change("c", lsn, seq + 100, id=new, **state.pop(key)))
                state[new] = {"name": txn[-1]["name"], "body": txn[-1]["body"]}
            elif key in state:
                if draw(st.booleans()):  # body not sent: unchanged TOASTed value
                    txn.append(change("u", lsn, seq, ("body",), id=key, name=name))
                    state[key]["name"] = name
                else:
                    body = draw(st.sampled_from(["x", "y"]))
                    txn.append(change("u", lsn, seq, id=key, name=name, body=body))
                    state[key] = {"name": name, "body": body}
            else:
                body = draw(st.sampled_from(["x", "y", None]))
                txn.append(change("c", lsn, seq, id=key, name=name, body=body))
                state[key] = {"name": name, "body": body}
        if txn:
            txns.append(txn)
    sizes = draw(st.lists(st.integers(1, 4), min_size=len(txns), max_size=len(txns)))
    replays = draw(st.lists(st.tuples(st.integers(0, 20), st.sampled_from(["q", "other"])),
                            max_size=3))
    return txns, sizes, replays


def _batches(txns: list[Txn], sizes: list[int]) -> list[list[dict[str, Any]]]:
    out, i = [], 0
    for size in sizes:
        if i >= len(txns):
            break
        out.append([c for txn in txns[i:i + size] for c in txn])
        i += size
    return out


def _run(path: Path, spec: ApplySpec, txns: list[Txn], sizes: list[int],
         replays: list[tuple[int, str]], piece: int | None = None) -> None:
    """Apply the batches in order; with *piece*, each in pieces of that many changes."""
    batches = _batches(txns, sizes)
    for version, batch in enumerate(batches):
        if piece is None:
            apply_changes(path, rows(*batch), spec, app_id="q", version=version)
        else:
            before = _version(path)
            ordered = sorted(batch, key=lambda c: (c["_commit_lsn"], c["_seq"]))
            apply_changes_in_steps(path, (rows(*ordered[i:i + piece])
                                          for i in range(0, len(ordered), piece)),
                                   spec, app_id="q", version=version)
            # One commit for the batch (after the one creating the table).
            assert _version(path) - max(before, 0) <= 1
        for when, app in replays:
            if when == version:  # replay an earlier batch after this one
                earlier = version // 2
                apply_changes(path, rows(*batches[earlier]), spec, app_id=app,
                              version=earlier)


def _version(path: Path) -> int:
    return DeltaTable(str(path)).version() if (path / "_delta_log").exists() else -1


def _model_scd1(txns: list[Txn]) -> list[dict[str, Any]]:
    table: dict[int, dict[str, Any]] = {}
    for c in (c for txn in txns for c in sorted(txn, key=lambda c: c["_seq"])):
        if c["_op"] == "t":
            table.clear()
        elif c["_op"] == "d":
            table.pop(c["id"], None)
        else:
            row = {"id": c["id"], "name": c["name"], "body": c.get("body")}
            if "body" in c["_unavailable"]:
                row["body"] = table[c["id"]]["body"]
            table[c["id"]] = row
    return [table[k] for k in sorted(table)]


def _model_scd2(txns: list[Txn]) -> list[tuple[Any, ...]]:
    """One version per key and transaction holding the key's state at commit; a commit
    that leaves every column as it was changes nothing; a truncate closes everything."""
    versions: list[dict[str, Any]] = []
    current: dict[int, dict[str, Any]] = {}
    state: dict[int, dict[str, Any]] = {}
    for txn in txns:
        at = txn[0]["_commit_lsn"]
        touched: set[int] = set()
        truncated = False
        for c in sorted(txn, key=lambda c: c["_seq"]):
            if c["_op"] == "t":
                state.clear()
                truncated = True
            elif c["_op"] == "d":
                state.pop(c["id"])
                touched.add(c["id"])
            else:
                image = {"name": c["name"], "body": c.get("body")}
                if "body" in c["_unavailable"]:
                    image["body"] = state[c["id"]]["body"]
                state[c["id"]] = image
                touched.add(c["id"])
        if truncated:
            for version in current.values():
                version["end"] = at
            current.clear()
        for key in sorted(touched | (set(state) if truncated else set())):
            old, new = current.get(key), state.get(key)
            if old is not None and new is not None and all(old[k] == v for k, v in new.items()):
                continue
            if old is not None:
                old["end"] = at
                del current[key]
            if new is not None:
                current[key] = {"id": key, **new, "start": at, "end": None}
                versions.append(current[key])
    return sorted(((v["id"], v["name"], v["body"], v["start"], v["end"]) for v in versions),
                  key=repr)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.booleans(), st.sampled_from([None, 1, 2, 3]))
def test_scd1_batches_and_replays_equal_the_dict_model(workload: Any, ordered: bool,
                                                       piece: int | None) -> None:
    txns, sizes, replays = workload
    if not ordered:  # no high-water mark: only app-transaction replays are recognised
        replays = [(when, "q") for when, _ in replays]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t"
        _run(path, ApplySpec(keys=("id",), ordered_batches=ordered), txns, sizes, replays,
             piece)
        assert not (path / "_tidemark_branches").exists()
        actual = read(path, "id", "name", "body") if (path / "_delta_log").exists() else []
    assert actual == _model_scd1(txns)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from([None, 1, 2, 3]))
def test_scd2_batches_and_replays_equal_the_version_model(workload: Any,
                                                          piece: int | None) -> None:
    txns, sizes, replays = workload
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t"
        _run(path, ApplySpec(keys=("id",), stored_as_scd_type=2), txns, sizes, replays,
             piece)
        actual = []
        if (path / "_delta_log").exists():
            table = read(path, "id", "name", "body", "__START_AT", "__END_AT")
            actual = sorted((tuple(r.values()) for r in table), key=repr)
    assert actual == _model_scd2(txns)
