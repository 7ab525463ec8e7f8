"""How much of the code knows which source it runs: the measures of the source interface.

Prints, for ``src/tidemark`` (or the tree given with ``--root``):
- comparisons on the source kind outside ``source/``: a comparison, ``in`` test, ``match``
  case or dict key whose constant is a source kind's name (``"postgres"``, ``"mariadb"``,
  ``"logtable"``, ``"sqlite"``);
- modules importing psycopg2 (``src/``, ``tests/``, ``benchmarks/``, ``scripts/``);
- imports from a lower layer to a higher one (the layers, top down: cli; pipeline; spark,
  engine, status; source; serde; lake, offsets; the core modules), each listed;
- modules over 500 lines, each listed;
- servers that benchmarks start without saying how durable they are: a
  ``PostgresCluster(...)`` or ``MariaDbServer(...)`` in ``benchmarks/`` without a
  ``durable=`` argument (benchmarks run production durability; a soak may choose).

Usage: ``uv run python benchmarks/structure.py [--root PATH] [--list]``
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

KINDS = frozenset({"postgres", "mariadb", "logtable", "sqlite"})
#: Top down; a module may import its own layer or lower ones.
LAYERS = {"cli": 0, "pipeline": 1, "verify": 1, "spark": 2, "engine": 2, "status": 2, "source": 3,
          "serde": 4, "lake": 5, "offsets": 5}
CORE = 6
#: Not layered: the front door re-exports everything; testing helps tests.
UNLAYERED = {"__init__", "__main__", "testing"}
LONG = 500


def _layer(module: str) -> int | None:
    """*module* is dotted below ``tidemark`` (``pipeline.runner``)."""
    top = module.split(".", 1)[0]
    if top in UNLAYERED:
        return None
    return LAYERS.get(top, CORE)


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _is_kind(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in KINDS
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_kind(e) for e in node.elts)
    return False


def kind_comparisons(tree: ast.AST) -> list[int]:
    """Line numbers of comparisons / dict keys / match cases on a kind name."""
    lines: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and (
                _is_kind(node.left) or any(_is_kind(c) for c in node.comparators)):
            lines.append(node.lineno)
        elif isinstance(node, ast.Dict):
            lines.extend(k.lineno for k in node.keys if k is not None and _is_kind(k))
        elif isinstance(node, ast.MatchValue) and _is_kind(node.value):
            lines.append(node.lineno)
    return lines


def imports(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """``(line, imported tidemark module below tidemark)`` for every import."""
    found: list[tuple[int, str]] = []
    package = module.split(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level]
                name = ".".join(["tidemark", *base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return [(line, name.removeprefix("tidemark.")) for line, name in found
            if name.startswith("tidemark.")]


SERVERS = frozenset({"PostgresCluster", "MariaDbServer"})


def servers_without_durability(tree: ast.AST) -> list[int]:
    """Line numbers of server constructions that do not pass ``durable=``."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in SERVERS
            and not any(k.arg == "durable" for k in node.keywords)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).parent.parent)
    parser.add_argument("--list", action="store_true", help="list each finding")
    args = parser.parse_args()
    src = args.root / "src" / "tidemark"
    comparisons: list[str] = []
    upward: list[str] = []
    long: list[str] = []
    for path in sorted(src.rglob("*.py")):
        module = _module_name(src, path)
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        if not module.startswith(("source", "testing")):
            comparisons.extend(f"{module}:{n}" for n in kind_comparisons(tree))
        lines = len(text.splitlines())
        if lines > LONG:
            long.append(f"{module} ({lines})")
        mine = _layer(module)
        if mine is None:
            continue
        for line, name in imports(tree, module):
            theirs = _layer(name)
            if theirs is not None and theirs < mine:
                upward.append(f"{module}:{line} -> {name}")
    psycopg2 = [str(p.relative_to(args.root)) for d in ("src", "tests", "benchmarks", "scripts")
                for p in sorted((args.root / d).rglob("*.py"))
                if any(isinstance(n, ast.Import | ast.ImportFrom)
                       and any((a.name if isinstance(n, ast.Import) else n.module or "")
                               .startswith("psycopg2") for a in n.names)
                       for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))))]
    undurable = [f"{p.relative_to(args.root)}:{line}"
                 for p in sorted((args.root / "benchmarks").glob("*.py"))
                 for line in servers_without_durability(ast.parse(p.read_text(encoding="utf-8")))]
    for title, found in (("comparisons on the source kind outside source/", comparisons),
                         ("modules importing psycopg2", psycopg2),
                         ("imports from a lower layer to a higher one", upward),
                         (f"modules over {LONG} lines", long),
                         ("benchmark servers without durable=", undurable)):
        print(f"{title}: {len(found)}")
        if args.list:
            for item in found:
                print(f"    {item}")


if __name__ == "__main__":
    main()
