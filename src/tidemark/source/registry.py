"""Which kind of source a connection string names: the one place that tells them apart.

Each kind decides itself whether a DSN is its own (:meth:`SourceKind.claims`). The
kinds are asked in turn: those registered later (plugins) first, then the built-ins,
MariaDB (``mariadb://``, ``mysql://``), log tables (``sqlite:``, or a PostgreSQL
database with ``--source logtable``) and last PostgreSQL, which takes any libpq
connection string or URI. The built-ins are registered by module path and imported
when first asked for, so importing this module imports no source; packages add kinds
through the ``tidemark.sources`` entry-point group (each entry point names a
:class:`SourceKind` instance, class or factory).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import threading
from typing import Final

from tidemark.errors import ConfigError
from tidemark.source.kind import SourceKind

log = logging.getLogger(__name__)

MARIADB_SCHEMES: Final = ("mariadb://", "mysql://")
SQLITE_SCHEME: Final = "sqlite:"
#: What ``--source`` / ``[source] kind`` accept (of the built-in kinds).
KINDS: Final = ("replication", "logtable")
#: The entry-point group whose entries are source kinds of installed packages.
ENTRY_POINT_GROUP: Final = "tidemark.sources"

#: The built-in kinds, in the order they are asked, by ``module:attribute``.
_BUILT_IN: Final = ("tidemark.source.mariadb.kind:KIND", "tidemark.source.logtable.kind:KIND",
                    "tidemark.source.postgres.kind:KIND")

_lock = threading.Lock()
_plugins_lock = threading.RLock()  # reentrant: a plugin's import may ask the registry
_plugins_loading = False
_registered: list[SourceKind] = []  # in registration order; asked last-first
_built_in: list[SourceKind] | None = None
_plugins_loaded = False
_from_entry_points: set[str] = set()  # names of the kinds the entry points registered


def register(kind: SourceKind) -> None:
    """Add *kind*; it is asked before every kind registered earlier and the built-ins
    (a kind of the same name replaces the earlier one)."""
    if not isinstance(kind, SourceKind):
        raise TypeError(f"{kind!r} is not a SourceKind")
    with _lock:
        _registered[:] = [k for k in _registered if k.name != kind.name]
        _registered.append(kind)


def unregister(name: str) -> None:
    """Remove the registered (not built-in) kind called *name*, if there is one."""
    with _lock:
        _registered[:] = [k for k in _registered if k.name != name]


def kinds() -> tuple[SourceKind, ...]:
    """Every kind, in the order :func:`kind_of` asks them."""
    _load_plugins()
    with _lock:
        plugins = tuple(reversed(_registered))
    names = {k.name for k in plugins}
    return plugins + tuple(k for k in _built_ins() if k.name not in names)


def requested_names() -> tuple[str, ...]:
    """What ``--source`` / ``[source] kind`` may say."""
    found: list[str] = list(KINDS)
    for kind in kinds():
        found += [n for n in kind.requested_names if n not in found]
    return tuple(found)


def kind_of(dsn: str, requested: str | None = None) -> SourceKind:
    """The kind of source *dsn* connects to; *requested* (``--source``) chooses between
    the ways to read one database (``"logtable"`` reads a PostgreSQL database's log
    tables instead of its WAL)."""
    allowed = requested_names()
    if requested is not None and requested not in allowed:
        raise ConfigError("source", f"{requested!r} is not a source kind; use one of "
                          f"{', '.join(allowed)}")
    text = dsn.strip().lower()
    for kind in kinds():
        if kind.claims(text, requested):
            return kind
    raise ConfigError("dsn", "no source kind takes this connection string")


def kind_named(name: str) -> SourceKind:
    """The kind called *name* (``postgres``, ``mariadb``, ``logtable``, a plugin's)."""
    for kind in kinds():
        if kind.name == name:
            return kind
    raise ConfigError("source", f"{name!r} is not a source kind tidemark knows; known: "
                      f"{', '.join(k.name for k in kinds())}")


def runtime_kinds() -> tuple[SourceKind, ...]:
    """The kinds registered at run time in this process (not built in, not from an entry
    point): another process (Spark's Python workers) knows them only if they are handed
    over."""
    _load_plugins()
    with _lock:
        return tuple(k for k in _registered if k.name not in _from_entry_points)


def source_kind(dsn: str, requested: str | None = None) -> str:
    """The name of :func:`kind_of`'s kind (kept for callers that record it)."""
    return kind_of(dsn, requested).name


def _built_ins() -> list[SourceKind]:
    global _built_in  # noqa: PLW0603 - imported once, on first use
    if _built_in is None:
        loaded: list[SourceKind] = []
        for path in _BUILT_IN:
            module, _, attribute = path.partition(":")
            loaded.append(getattr(importlib.import_module(module), attribute))
        _built_in = loaded
    return _built_in


def _load_plugins() -> None:
    """Register the kinds of the ``tidemark.sources`` entry points (once; another thread
    asking meanwhile waits for them, and a plugin that asks the registry while it is
    being loaded gets the kinds registered so far)."""
    global _plugins_loaded, _plugins_loading  # noqa: PLW0603 - loaded once, on first use
    if _plugins_loaded:
        return
    with _plugins_lock:
        if _plugins_loaded or _plugins_loading:
            return
        _plugins_loading = True
        try:
            for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                try:
                    loaded = entry.load()
                    kind = loaded if isinstance(loaded, SourceKind) else loaded()
                    register(kind)
                    _from_entry_points.add(kind.name)
                except Exception as err:  # one broken plugin must not stop the others
                    log.warning("cannot load source kind %s (%s) of entry point group %s: "
                                "%s", entry.name, entry.value, ENTRY_POINT_GROUP, err)
        finally:
            _plugins_loading = False
        _plugins_loaded = True
