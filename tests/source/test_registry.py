"""The source registry: which kind a DSN is, kinds registered by plugins and entry points."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tidemark.errors import ConfigError
from tidemark.source import registry
from tidemark.source.kind import (
    Capture,
    CaptureRequest,
    Row,
    SourceKind,
    SourceProgress,
    StatusModules,
)


class _EchoKind(SourceKind):
    """A kind of its own ``echo://`` DSNs, as a plugin would register it."""

    name = "echo"
    requested_names = ("echo",)

    def claims(self, dsn: str, requested: str | None) -> bool:
        return dsn.startswith("echo://") or requested == "echo"

    def check_dsn(self, dsn: str, key: str) -> None:
        if not dsn.startswith("echo://"):
            raise ConfigError(key, "not an echo:// URL")

    def redact_dsn(self, dsn: str) -> str:
        return dsn.rsplit("@", maxsplit=1)[-1]

    def capture(self, request: CaptureRequest) -> Capture:
        raise NotImplementedError

    def position_text(self, position: int) -> str:
        return f"echo {position}"

    def log_position(self, offset: Mapping[str, Any]) -> int:
        return int(offset["n"])

    def progress(self, dsn: str, *, slot: str, tables: Sequence[str]) -> SourceProgress:
        raise NotImplementedError

    def identity_database(self, dsn: str) -> str:
        return dsn

    def read_plan_module(self) -> str:
        return "echo.read_plan"

    def status_modules(self) -> StatusModules:
        return StatusModules("echo.status", "echo.pipeline_status")

    def table_rows(self, dsn: str, table: str, columns: Sequence[str],
                   text_columns: Sequence[str], utc_columns: Sequence[str]) -> list[Row]:
        return []


@pytest.fixture
def echo() -> Iterator[_EchoKind]:
    kind = _EchoKind()
    registry.register(kind)
    yield kind
    registry.unregister(kind.name)


@pytest.mark.parametrize(("dsn", "requested", "name"), [
    ("host=db dbname=app", None, "postgres"),
    ("postgresql://u@db/app", "replication", "postgres"),
    ("host=db dbname=app", "logtable", "logtable"),
    ("sqlite:///tmp/x.db", None, "logtable"),
    ("SQLITE:///tmp/x.db", "logtable", "logtable"),
    ("mariadb://u:p@db:3306/app", None, "mariadb"),
    (" mysql://u@db/app", "replication", "mariadb"),
])
def test_kind_of_names_the_kind(dsn: str, requested: str | None, name: str) -> None:
    kind = registry.kind_of(dsn, requested)
    assert kind.name == name
    assert registry.source_kind(dsn, requested) == name
    assert registry.kind_named(name) is kind


@pytest.mark.parametrize(("dsn", "requested", "message"), [
    ("host=db", "wal", "'wal' is not a source kind; use one of replication, logtable"),
    ("mariadb://u@db/app", "logtable", "log tables are for PostgreSQL and SQLite"),
    ("sqlite:///x.db", "replication", "SQLite has no replication stream"),
])
def test_kind_of_refuses_what_cannot_be(dsn: str, requested: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        registry.kind_of(dsn, requested)


def test_positions_read_per_kind() -> None:
    assert registry.kind_named("postgres").position_text(0x16_B374D848) == "16/B374D848"
    assert registry.kind_named("mariadb").position_text((3 << 32) | 1234) == "binlog 3:1234"
    assert registry.kind_named("logtable").position_text(7) == "log position 7"
    assert registry.kind_named("postgres").log_position({"lsn": "1/10"}) == (1 << 32) + 16
    assert registry.kind_named("logtable").default_schema("sqlite:///x.db") == "main"
    assert registry.kind_named("logtable").default_schema("host=db") == "public"


def test_a_registered_kind_claims_its_dsns_first(echo: _EchoKind) -> None:
    assert registry.kind_of("echo://u@box/app") is echo
    assert registry.kinds()[0] is echo
    assert [k.name for k in registry.kinds()][1:] == ["mariadb", "logtable", "postgres"]
    # Its requested name is one --source accepts; the built-ins still get theirs.
    assert registry.kind_of("host=db", "echo") is echo
    assert "echo" in registry.requested_names()
    assert registry.kind_of("host=db").name == "postgres"
    assert registry.kind_named("echo").redact_dsn("echo://secret@box") == "box"


def test_register_refuses_what_is_no_kind() -> None:
    with pytest.raises(TypeError, match="not a SourceKind"):
        registry.register("echo")  # type: ignore[arg-type]


def test_importing_the_registry_imports_no_source() -> None:
    code = ("import sys, tidemark.source.registry as r; "
            "print(sorted(m for m in sys.modules if m.startswith('tidemark.source.')))")
    before = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60).stdout
    assert "kind'" in before and "postgres" not in before and "mariadb" not in before
    # Asking for a PostgreSQL DSN's kind imports neither PyMySQL nor pyspark.
    asked = subprocess.run(
        [sys.executable, "-c", "import sys, tidemark.source.registry as r; "
         "r.kind_of('host=db').position_text(1); "
         "print([m for m in ('pymysql', 'pyspark') if m in sys.modules])"],
        capture_output=True, text=True, check=True, timeout=60).stdout
    assert asked.strip() == "[]"


def test_entry_points_add_kinds(tmp_path: Path) -> None:
    """A package's ``tidemark.sources`` entry point is registered on first use."""
    package = tmp_path / "echo_plugin"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from tidemark.source.registry import kind_named\n"
        "class EchoKind(type(kind_named('mariadb'))):\n"
        "    name = 'echo'\n"
        "    def claims(self, dsn, requested):\n"
        "        return dsn.startswith('echo://')\n", encoding="utf-8")
    info = tmp_path / "echo_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin\nVersion: 1.0\n",
                                   encoding="utf-8")
    (info / "entry_points.txt").write_text("[tidemark.sources]\necho = echo_plugin:EchoKind\n",
                                           encoding="utf-8")
    code = ("import tidemark.source.registry as r; "
            "print(r.kind_of('echo://box').name, r.kind_of('host=db').name)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60, env={"PYTHONPATH": str(tmp_path),
                                             "PATH": "/usr/bin:/bin"})
    assert result.stdout.split() == ["echo", "postgres"], result.stderr
