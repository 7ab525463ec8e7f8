"""The global privileges a MariaDB capture needs, checked before anything is read.

A capture asks the server where its binlog ends (``SHOW MASTER STATUS``: ``BINLOG
MONITOR`` on MariaDB 10.5+, ``REPLICATION CLIENT`` before and on MySQL) and then dumps
the binlog (``COM_BINLOG_DUMP``: ``REPLICATION SLAVE``). Without the second, a capture
would take the whole snapshot, write it out, and only then be refused.

The grants are not parsed from ``SHOW GRANTS`` (``ALL PRIVILEGES``, roles, default
roles and partial revokes each change what it means): each privilege is checked by
doing what needs it. The dump is opened non-blocking with a replica id of its own (a
dump with a running capture's id would end that capture's dump) and closed after its
first packet, where the server refuses a user without the privilege.
"""

from __future__ import annotations

import random
from typing import Any

import pymysql

from tidemark.source.mariadb import client
from tidemark.source.mariadb.position import BinlogPosition

_REPLICATION_SLAVE = "REPLICATION SLAVE"


def check_grants(conn: pymysql.Connection[Any], settings: client.ConnectionSettings, *,
                 dump: bool = True) -> None:
    """Raise :class:`~tidemark.source.mariadb.client.MissingPrivilegeError` naming every
    global privilege the user of *conn* lacks for a capture, and the GRANT that gives
    them (*dump*: the capture reads the binlog, not only a snapshot)."""
    missing: list[tuple[str, str]] = []
    position: BinlogPosition | None = None
    try:
        position = client.current_position(conn)
    except client.MissingPrivilegeError:
        missing.append((_monitor_privilege(conn), "to find the binlog's end"))
    if dump and not _can_dump(settings, position):
        missing.append((_REPLICATION_SLAVE, "to read the binlog"))
    if not missing:
        return
    user = current_user(conn)
    privileges = ", ".join(name for name, _ in missing)
    why = "; ".join(f"{name} {reason}" for name, reason in missing)
    raise client.MissingPrivilegeError(
        f"MariaDB user {user} lacks {privileges} ({why}): grant it before the capture "
        f"starts: GRANT {privileges} ON *.* TO {user}", privileges)


def current_user(conn: pymysql.Connection[Any]) -> str:
    """The account the server authenticated, as GRANT names it (``'user'@'host'``)."""
    with conn.cursor() as cur:
        cur.execute("SELECT CURRENT_USER()")
        row = cur.fetchone()
    name, _, host = str(row[0] if row else "").rpartition("@")
    return f"'{name}'@'{host}'"


def _monitor_privilege(conn: pymysql.Connection[Any]) -> str:
    """The privilege ``SHOW MASTER STATUS`` needs on this server."""
    with conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        row = cur.fetchone()
    version = str(row[0] if row else "")
    numbers = [int(part) for part in version.split("-", 1)[0].split(".")[:2] if part.isdigit()]
    if "mariadb" in version.lower() and tuple(numbers) >= (10, 5):
        return "BINLOG MONITOR"
    return "REPLICATION CLIENT"


def _can_dump(settings: client.ConnectionSettings, position: BinlogPosition | None) -> bool:
    """False if the server refuses this user a binlog dump."""
    # Where it starts does not matter (the refusal comes before any event); from the
    # binlog's end, the server sends a few events and ends the non-blocking dump.
    start = BinlogPosition(position.file, position.pos, "") if position is not None \
        else BinlogPosition("", 4, "")
    stream = client.BinlogStream(settings, start, server_id=probe_server_id(),
                                 blocking=False)
    try:
        stream.open()
        next(iter(stream.events()), None)
    except client.MissingPrivilegeError as err:
        if err.privilege != _REPLICATION_SLAVE:
            raise
        return False
    finally:
        stream.close()
    return True


def probe_server_id() -> int:
    """A replica id for a short dump of tidemark's own: the server ends a dump when
    another connects with the same id, so each takes a random one (2^31 of them, above
    the ids people give replicas)."""
    return random.randrange(1 << 20, 1 << 31)
