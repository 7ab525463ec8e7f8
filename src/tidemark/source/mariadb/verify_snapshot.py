"""``tidemark verify``'s snapshot of a MariaDB source at an exact binlog position.

``START TRANSACTION WITH CONSISTENT SNAPSHOT`` opens an InnoDB read view and, in the
same step, notes the binlog coordinates it matches (``binlog_snapshot_file`` and
``binlog_snapshot_position`` in the session's status): the read view holds every
transaction written to the binlog before them and none after. The transaction stays
open as the snapshot the checksums read.

**Position.** :attr:`MariaDbVerifySnapshot.position` is those coordinates as the int64
:func:`tidemark.source.mariadb.position.ordering_key` (file number << 32 | byte), the
units of ``MariaDbKind.log_position``: a Spark offset names the next binlog event to
read, so a pipeline whose committed offset is ``>= position`` has read every
transaction of the snapshot.

**Changed keys.** :meth:`~MariaDbVerifySnapshot.changed_key_hashes` dumps the binlog
from the snapshot's coordinates to its current end (a non-blocking ``COM_BINLOG_DUMP``
with a replica id of its own, held by the same named lock a capture holds, so no
pipeline's dump is ended by it) and decodes the rows events of the table with the
capture's own decoder.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

import pyarrow as pa
import pymysql

from tidemark.errors import SourceError
from tidemark.event import UNAVAILABLE, TableId, WireTuple, WireValue
from tidemark.row_checksum import TableShape, value_text
from tidemark.row_checksum import key_hash as texts_key_hash
from tidemark.source.mariadb import binlog as b
from tidemark.source.mariadb import client
from tidemark.source.mariadb.grants import check_grants
from tidemark.source.mariadb.position import BinlogPosition
from tidemark.source.mariadb.replica_id import ReplicaIdClaim, ReplicaIdInUseError
from tidemark.source.mariadb.row_decoder import RowDecoder
from tidemark.source.mariadb.table_map import TableColumn, TableMap, parse_table_map
from tidemark.source.mariadb.types import python_parser
from tidemark.source.verify_snapshot import TruncatedAfterSnapshotError

if TYPE_CHECKING:
    from tidemark.row_checksum import ChecksumSide

log = logging.getLogger(__name__)

#: Replica ids a verify dumps with: above the range captures derive theirs from
#: (5400-6399, :meth:`MariaDbSourceConfig.replica_server_id`).
_VERIFY_IDS: Final = range(7400, 8400)
_ID_ATTEMPTS: Final = 10


def open_verify_snapshot(dsn: str, tables: Sequence[TableId], *,
                         publication: str = "") -> MariaDbVerifySnapshot:
    """A snapshot of *tables* at an exact binlog position (see the module docstring);
    *publication* is PostgreSQL's and not used here."""
    settings = client.parse_url(dsn)
    conn = client.connect(settings)
    try:
        check_grants(conn, settings)
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
            status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
    except BaseException:
        conn.close()
        raise
    file = status.get("binlog_snapshot_file", "")
    if not file:
        conn.close()
        raise SourceError("the server reports no binlog position for a consistent "
                          "snapshot (binlog_snapshot_file is empty): the binary log is "
                          "off; start the server with --log-bin")
    start = BinlogPosition(file, int(status["binlog_snapshot_position"]))
    log.info("verify snapshot at %s", start)
    return MariaDbVerifySnapshot(conn, settings, start, tables)


class MariaDbVerifySnapshot:
    """A :class:`~tidemark.source.verify_snapshot.VerifySnapshot` of MariaDB: a
    consistent-snapshot transaction and the binlog coordinates it matches."""

    def __init__(self, conn: pymysql.Connection[Any], settings: client.ConnectionSettings,
                 start: BinlogPosition, tables: Sequence[TableId]) -> None:
        self._conn = conn
        self._settings = settings
        self._start = start
        self._tables = tuple(tables)

    @property
    def position(self) -> int:
        """The snapshot's binlog coordinates as an ordering key (module docstring)."""
        return self._start.key

    @property
    def binlog_position(self) -> BinlogPosition:
        """The snapshot's binlog coordinates (file and byte)."""
        return self._start

    @property
    def connection(self) -> pymysql.Connection[Any]:
        """The connection whose open transaction is the snapshot."""
        return self._conn

    def side(self, table: TableId) -> ChecksumSide:
        """Checksums of *table* computed in the database on this snapshot."""
        # Imported by name: the dialect is built beside this module.
        module = importlib.import_module("tidemark.source.mariadb.checksum")
        return cast("ChecksumSide", module.MariaDbChecksumSide(self._conn, table))

    def changed_key_hashes(self, table: TableId, shape: TableShape) -> frozenset[int]:
        """Key hashes of the rows of *table* that transactions written to the binlog
        after :attr:`position`, up to its end now, inserted, updated (old and new key)
        or deleted."""
        hashes: set[int] = set()
        hasher: Callable[[WireTuple], int] | None = None
        mapped: dict[int, bool] = {}  # table_id -> whether it is *table*
        maps: dict[bytes, TableMap] = {}
        for header, body in self._events():
            kind = header.type
            if kind == b.TABLE_MAP_EVENT:
                table_map = maps.get(body) or maps.setdefault(body, parse_table_map(body))
                ours = TableId(table_map.database, table_map.table) == table
                mapped[table_map.table_id] = ours
                if ours:
                    decoder = RowDecoder(table_map)
                    hasher = _key_hasher(table_map, shape)
            elif kind in b.ROWS_EVENTS:
                if not mapped.get(int.from_bytes(body[0:6], "little")) or hasher is None:
                    continue
                for before, after in decoder.rows(_parse_rows(header, body)):
                    hashes.update(hasher(image) for image in (before, after)
                                  if image is not None)
            elif kind == b.QUERY_EVENT:
                _refuse_truncate(b.parse_query(body), table)
        return frozenset(hashes)

    def _events(self) -> Iterator[tuple[b.EventHeader, bytes]]:
        """The binlog's events from the snapshot's coordinates to its end now."""
        claim, server_id = _claim_replica_id(self._settings)
        try:
            stream = client.BinlogStream(self._settings, self._start,
                                         server_id=server_id, blocking=False)
            with stream:
                decoder = b.EventDecoder(stream.checksum)
                for event in stream.events():
                    yield decoder.split(event)
        finally:
            claim.release()

    def close(self) -> None:
        """End the snapshot transaction and its connection."""
        with contextlib.suppress(pymysql.err.MySQLError, OSError):
            self._conn.rollback()
        with contextlib.suppress(Exception):
            self._conn.close()


def _claim_replica_id(settings: client.ConnectionSettings) -> tuple[ReplicaIdClaim, int]:
    """A replica id no capture or other verify dumps with now, held until released."""
    for _ in range(_ID_ATTEMPTS):
        server_id = _VERIFY_IDS[secrets.randbelow(len(_VERIFY_IDS))]
        claim = ReplicaIdClaim(settings, server_id)
        try:
            claim.claim()
        except ReplicaIdInUseError:
            continue
        return claim, server_id
    raise SourceError(f"no free replica id in {_VERIFY_IDS.start}-{_VERIFY_IDS.stop - 1} "
                      f"after {_ID_ATTEMPTS} tries: too many verifies at once")


def _parse_rows(header: b.EventHeader, body: bytes) -> b.RowsEvent:
    return b.parse_rows(body, header.type)


def _refuse_truncate(query: b.Query, table: TableId) -> None:
    text = query.sql.lstrip().lower()
    if text.startswith("truncate") and \
            re.search(rf"\b{re.escape(table.table.lower())}\b", text):
        raise TruncatedAfterSnapshotError(table)


def _key_hasher(table_map: TableMap, shape: TableShape) -> Callable[[WireTuple], int]:
    """The function giving a row image's key hash."""
    index = {c.name: i for i, c in enumerate(table_map.columns)}
    missing = [k for k in shape.keys if k not in index]
    if missing:
        raise SourceError(f"{table_map.database}.{table_map.table} has no column(s) "
                          f"{', '.join(missing)} of the verified key in its binlog table "
                          "map (binlog_row_metadata must be FULL)")
    targets = {c.name: c.target_type for c in shape.columns}
    plan = [(index[k], _to_text(table_map.columns[index[k]], targets[k]))
            for k in shape.keys]

    def key_hash(image: WireTuple) -> int:
        return texts_key_hash([convert(image[i]) for i, convert in plan], shape)

    return key_hash


def _to_text(column: TableColumn,
             target_type: pa.DataType) -> Callable[[WireValue], str | None]:
    """The canonical text of a key value as the target holds it: a string column holds
    the text the row decoder renders; any other the value the type's parser makes."""
    text_target = pa.types.is_string(target_type) or pa.types.is_large_string(target_type)
    parse = python_parser(column)

    def convert(value: WireValue) -> str | None:
        if value is None:
            return None
        if value is UNAVAILABLE:
            raise SourceError(f"column {column.name} of the verified key is missing from "
                              "a binlog row image: set binlog_row_image = FULL")
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace") if text_target \
                else value_text(value, target_type)
        if text_target:
            return str(value)
        return value_text(parse(str(value)), target_type)

    return convert

