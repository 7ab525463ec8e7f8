"""``tidemark verify``'s snapshot of a PostgreSQL source at an exact WAL position.

A TEMPORARY logical slot created on a replication connection exports a snapshot whose
contents match the slot's consistent point exactly: the snapshot holds every
transaction whose commit record starts before that point, and decoding the slot yields
every transaction committing at or after it. The snapshot is imported into a normal
connection (``SET TRANSACTION SNAPSHOT``), whose REPEATABLE READ transaction stays open
as the snapshot the checksums read.

**Position.** :attr:`PostgresVerifySnapshot.position` is the consistent point, an LSN.
A Spark offset ``{"lsn": L}`` (:func:`tidemark.source.postgres.stream_offsets.from_offset`
is ``PostgresKind.log_position``) means every transaction whose commit LSN is below
``L`` is read. So a pipeline whose committed offset is ``>= position`` has every
transaction of the snapshot in its target: ``position`` is directly comparable with
``log_position(offset)``.

**Changed keys.** :meth:`~PostgresVerifySnapshot.changed_key_hashes` peeks the slot
(``pg_logical_slot_peek_binary_changes``, pgoutput protocol 1 over the pipeline's
publication) on the replication session that owns it (a temporary slot is acquired by
its own session only). Peeking never moves the slot, so each call decodes again from
the consistent point up to the WAL flushed when it is made; it first waits until the
WAL written before the call is flushed (with ``synchronous_commit = off`` a commit is
flushed by the WAL writer shortly after). The slot goes away with the replication
connection: at :meth:`~PostgresVerifySnapshot.close`, or when the process dies.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

import psycopg
import pyarrow as pa
from psycopg import pq, sql

from tidemark import postgres_connection
from tidemark.errors import SourceError, SourceUnavailableError, TidemarkError
from tidemark.event import TableId
from tidemark.row_checksum import RowTexts, TableShape, key_hash, value_text
from tidemark.source.postgres import pgoutput
from tidemark.source.postgres.replication import ReplicationStream
from tidemark.source.postgres.types import python_parser
from tidemark.source.verify_snapshot import TruncatedAfterSnapshotError

if TYPE_CHECKING:
    from tidemark.row_checksum import ChecksumSide

log = logging.getLogger(__name__)

#: How long a call waits for the WAL written before it to be flushed (decodable).
_FLUSH_WAIT_S: Final = 30.0
_FLUSH_POLL_S: Final = 0.02

#: After how long a verify slot still waiting for transactions names them.
_SLOT_NOTE_S: Final = 5.0
_FLUSH_SQL: Final = b"SELECT (pg_current_wal_flush_lsn() - '0/0')::bigint"
_INSERT_SQL: Final = b"SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint"


def open_verify_snapshot(dsn: str, tables: Sequence[TableId], *, publication: str,
                         wait_s: float = 120.0) -> PostgresVerifySnapshot:
    """A snapshot of *tables* at an exact WAL position (see the module docstring); the
    changes after it are read through *publication* (the pipeline's). Making its slot
    waits for every transaction holding an id then to end: one still running after
    *wait_s* seconds is named in the SourceError raised."""
    conn = postgres_connection.connect(dsn, application_name="tidemark-verify")
    try:
        _check_publication(conn, publication, tables)
        slot = stream_slot_name()
        stream = _replication(dsn, slot)
    except BaseException:
        conn.close()
        raise
    try:
        position, exported = _create_slot(dsn, stream, slot, wait_s)
        # The export stays importable until the replication session's next command.
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(exported)))
    except BaseException:
        stream.close()
        conn.close()
        raise
    log.info("verify snapshot at %s (temporary slot %s)", pgoutput.lsn_to_str(position),
             slot)
    return PostgresVerifySnapshot(conn, stream, slot, position, publication, tables)


def _create_slot(dsn: str, stream: ReplicationStream, slot: str,
                 wait_s: float) -> tuple[int, str]:
    """:meth:`ReplicationStream.create_slot` (temporary), given up after *wait_s*: a
    watcher names the transactions it waits for after :data:`_SLOT_NOTE_S`, and ends
    the slot's walsender at the deadline."""
    done = threading.Event()
    lock = threading.Lock()  # the slot is ended only while it still waits
    given_up: list[str] = []

    def watch() -> None:
        if done.wait(min(_SLOT_NOTE_S, wait_s)):
            return
        with contextlib.suppress(psycopg.Error, TidemarkError):
            log.warning("verify's temporary slot waits for %s to end (a slot's snapshot "
                        "needs every transaction running when it is made to finish)",
                        _running_transactions(dsn))
        if done.wait(max(0.0, wait_s - _SLOT_NOTE_S)):
            return
        try:
            running = _running_transactions(dsn)
        except (psycopg.Error, TidemarkError):
            running = "a transaction"
        with lock:
            if done.is_set():
                return
            given_up.append(running)
            with contextlib.suppress(psycopg.Error, TidemarkError):
                _end_walsender(dsn, slot)

    watcher = threading.Thread(target=watch, daemon=True, name=f"tidemark-watch-{slot}")
    watcher.start()
    try:
        made = stream.create_slot(temporary=True)
    except (SourceError, SourceUnavailableError):
        with lock:
            done.set()
        if given_up:
            raise SourceError(
                f"verify could not take its snapshot in {wait_s:.0f} s: its temporary "
                "slot waits until every transaction running when it was made has ended, "
                f"and {given_up[0]} still runs; end it, or verify again once it has "
                "ended (--wait gives it longer)") from None
        raise
    with lock:
        done.set()
        ended = bool(given_up)
    if ended:  # made just as its walsender was being ended: that session is gone
        raise SourceError(f"verify gave up on its temporary slot after {wait_s:.0f} s, as "
                          "it was made: verify again")
    return made


def _running_transactions(dsn: str) -> str:
    """The oldest transactions holding an id (the ones a new slot waits for), as people
    read them."""
    with contextlib.closing(postgres_connection.connect(
            dsn, application_name="tidemark-verify")) as conn:
        conn.autocommit = True
        rows = conn.execute(
            "SELECT pid, application_name, state, "
            "extract(epoch FROM now() - xact_start)::int FROM pg_stat_activity "
            "WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() "
            "ORDER BY xact_start LIMIT 3").fetchall()
    if not rows:
        return "transactions that have ended since"
    return ", ".join(f"the transaction of pid {pid} (application {app or '?'!r}, "
                     f"{state or 'state unknown'}, open for {age} s)"
                     for pid, app, state, age in rows)


def _end_walsender(dsn: str, slot: str) -> None:
    with contextlib.closing(postgres_connection.connect(
            dsn, application_name="tidemark-verify")) as conn:
        conn.autocommit = True
        conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                     "WHERE slot_name = %s AND active_pid IS NOT NULL", (slot,))


def stream_slot_name() -> str:
    """A slot name no other verify (nor pipeline) uses: the process id and random bits."""
    return f"tidemark_verify_{os.getpid()}_{secrets.token_hex(6)}"


def _replication(dsn: str, slot: str) -> ReplicationStream:
    stream = ReplicationStream(dsn, slot, "")
    try:
        stream.connect()
    except (SourceError, SourceUnavailableError) as err:
        text = str(err)
        if "replication role" in text or "permission denied to start WAL sender" in text \
                or "must have the REPLICATION" in text or "REPLICATION attribute" in text:
            user = postgres_connection.parse_dsn(dsn).get("user") or "the connecting role"
            raise SourceError(
                f"verify needs a replication connection and {user!r} may not open one "
                f"({text}): grant it with ALTER ROLE {user} REPLICATION (verify creates a "
                "temporary slot to take its snapshot at an exact WAL position)") from None
        raise
    return stream


def _check_publication(conn: psycopg.Connection[Any], publication: str,
                       tables: Sequence[TableId]) -> None:
    """Fail naming the fix unless *publication* exists and publishes every table:
    the changes in flight are read through it, and a table it does not send would
    look unchanged."""
    row = conn.execute("SELECT puballtables FROM pg_publication WHERE pubname = %s",
                       (publication,)).fetchone()
    if row is None:
        raise SourceError(
            f"publication {publication!r} does not exist: verify reads the changes in "
            "flight through the pipeline's publication; set [source] publication to it, "
            "or start the pipeline once (it creates the publication)")
    if row[0]:
        return
    published = {TableId(s, t) for s, t in conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
        (publication,)).fetchall()}
    missing = [t for t in tables if t not in published]
    if missing:
        listed = ", ".join(map(str, missing))
        raise SourceError(
            f"publication {publication!r} does not publish {listed}: the pipeline "
            f"cannot be capturing it; run ALTER PUBLICATION {publication} ADD TABLE "
            f"{listed} (or verify the tables the pipeline captures)")


class PostgresVerifySnapshot:
    """A :class:`~tidemark.source.verify_snapshot.VerifySnapshot` of PostgreSQL: a
    REPEATABLE READ transaction on an exported snapshot and the temporary slot that
    holds its position."""

    def __init__(self, conn: psycopg.Connection[Any], stream: ReplicationStream, slot: str,
                 position: int, publication: str, tables: Sequence[TableId]) -> None:
        self._conn = conn
        self._stream = stream
        self._slot = slot
        self._position = position
        self._publication = publication
        self._tables = tuple(tables)

    @property
    def position(self) -> int:
        """The slot's consistent point (an LSN): see the module docstring."""
        return self._position

    @property
    def slot(self) -> str:
        """The temporary slot's name (gone once closed)."""
        return self._slot

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The connection whose open transaction is the snapshot."""
        return self._conn

    def side(self, table: TableId) -> ChecksumSide:
        """Checksums of *table* computed in the database on this snapshot."""
        # Imported by name: the dialect is built beside this module (verify's core).
        module = importlib.import_module("tidemark.source.postgres.checksum")
        return cast("ChecksumSide", module.PostgresChecksumSide(self._conn, table))

    def changed_key_hashes(self, table: TableId, shape: TableShape) -> frozenset[int]:
        """Key hashes of the rows of *table* that transactions committed after
        :attr:`position` (and flushed before this call returns) inserted, updated (old
        and new key) or deleted."""
        return frozenset(self.changed_keys(table, shape))

    def changed_keys(self, table: TableId, shape: TableShape) -> dict[int, RowTexts]:
        """:meth:`changed_key_hashes`, each with its key's canonical texts (decoded
        from the changes anyway: a later round looks those keys up by value)."""
        self._wait_flushed()
        found: dict[int, RowTexts] = {}
        keys: Callable[[pgoutput.TupleData], RowTexts | None] | None = None
        relation = -1
        for message in self._peek():
            if isinstance(message, pgoutput.Relation):
                if TableId(message.namespace, message.name) == table:
                    relation = message.relation_id
                    keys = _key_texts(message, shape)
                continue
            if keys is None or getattr(message, "relation_id", None) != relation:
                if isinstance(message, pgoutput.Truncate) and keys is not None \
                        and relation in message.relation_ids:
                    raise TruncatedAfterSnapshotError(table)
                continue
            if isinstance(message, pgoutput.Insert):
                images: tuple[pgoutput.TupleData | None, ...] = (message.new,)
            elif isinstance(message, pgoutput.Update):
                images = (message.old, _with_old_keys(message.new, message.old))
            elif isinstance(message, pgoutput.Delete):
                images = (message.old,)
            else:
                continue
            for image in images:
                if image is not None and (texts := keys(image)) is not None:
                    found[key_hash(texts, shape)] = texts
        return found

    def _wait_flushed(self) -> None:
        """Wait until the WAL written before now is flushed: decoding reads no further."""
        target = self._scalar(_INSERT_SQL)
        deadline = time.monotonic() + _FLUSH_WAIT_S
        while self._scalar(_FLUSH_SQL) < target:
            if time.monotonic() > deadline:
                raise SourceUnavailableError(
                    f"the server did not flush its WAL up to {pgoutput.lsn_to_str(target)} "
                    f"within {_FLUSH_WAIT_S:.0f} s: changes after the verify snapshot "
                    "cannot be read yet; verify again")
            time.sleep(_FLUSH_POLL_S)

    def _scalar(self, command: bytes) -> int:
        result = self._replication_conn().exec_(command)
        if result.status != pq.ExecStatus.TUPLES_OK:
            raise SourceError(_error(result))
        return int(result.get_value(0, 0) or b"0")

    def _replication_conn(self) -> pq.abc.PGconn:
        conn = self._stream._conn  # the session owning the temporary slot
        if conn is None:
            raise SourceError("the verify snapshot is closed")
        return conn

    def _peek(self) -> Iterator[pgoutput.Message]:
        """The slot's pgoutput messages from the consistent point, one row at a time
        (single-row mode: a long window is never held whole)."""
        conn = self._replication_conn()
        command = (
            "SELECT data FROM pg_logical_slot_peek_binary_changes("
            f"'{self._slot}', NULL, NULL, 'proto_version', '1', "
            f"'publication_names', {_quote_literal(self._publication)})")
        conn.send_query(command.encode())
        conn.set_single_row_mode()
        failure: str | None = None
        while (result := conn.get_result()) is not None:
            if result.status == pq.ExecStatus.SINGLE_TUPLE:
                if failure is None:
                    value = result.get_value(0, 0) or b"\\x"
                    yield pgoutput.decode_message(bytes.fromhex(value[2:].decode()))
            elif result.status != pq.ExecStatus.TUPLES_OK:
                failure = _error(result)
        if failure is not None:
            raise SourceError(f"cannot read the changes after the verify snapshot from "
                              f"slot {self._slot!r}: {failure}")

    def close(self) -> None:
        """End the snapshot transaction and close the replication connection, which
        drops the temporary slot."""
        with contextlib.suppress(psycopg.Error):
            self._conn.close()
        self._stream.close()


def _quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _error(result: pq.abc.PGresult) -> str:
    text = (result.error_message or b"").decode(errors="replace").strip()
    return text.splitlines()[0] if text else str(result.status)


def _with_old_keys(new: pgoutput.TupleData,
                   old: pgoutput.TupleData | None) -> pgoutput.TupleData:
    """*new* with an unchanged TOASTed value (not sent) taken from *old*, where sent."""
    if old is None or pgoutput.UNCHANGED_TOAST not in new:
        return new
    return tuple(o if n is pgoutput.UNCHANGED_TOAST else n
                 for n, o in zip(new, old, strict=True))


def _key_texts(relation: pgoutput.Relation,
               shape: TableShape) -> Callable[[pgoutput.TupleData], RowTexts | None]:
    """The function giving a row image's key texts (None: the image lacks a key value:
    an old key tuple of a table whose replica identity is not the verified key)."""
    index = {c.name: i for i, c in enumerate(relation.columns)}
    targets = {c.name: c.target_type for c in shape.columns}
    missing = [k for k in shape.keys if k not in index]
    if missing:
        raise SourceError(f"{relation.namespace}.{relation.name} has no column(s) "
                          f"{', '.join(missing)} of the verified key")
    plan = [(index[k], _to_text(relation.columns[index[k]], targets[k]))
            for k in shape.keys]

    def key_texts(image: pgoutput.TupleData) -> RowTexts | None:
        texts: list[str | None] = []
        for i, convert in plan:
            value = image[i]
            if value is pgoutput.UNCHANGED_TOAST:
                return None
            texts.append(None if value is None else convert(value))
        return tuple(texts)

    return key_texts


def _to_text(column: pgoutput.RelationColumn,
             target_type: pa.DataType) -> Callable[[Any], str | None]:
    """The canonical text of a key value as the target holds it: a string column holds
    the text the server printed; any other the value the type's parser makes of it."""
    if pa.types.is_string(target_type) or pa.types.is_large_string(target_type):
        return str
    parse = python_parser(column.type_oid, column.type_modifier)
    return lambda text: value_text(parse(text), target_type)
