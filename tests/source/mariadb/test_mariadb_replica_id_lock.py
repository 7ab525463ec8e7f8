"""The replica-id lock of a running capture survives what its connection goes through:
a network cut that leaves the old connection (and the lock) on the server, a server
that cannot be reached for a while, and a server that stops answering (SIGSTOP)."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import pytest

from conftest import MariaDatabase
from tcp_cut import CuttableRelay
from tidemark.source.mariadb import client, replica_id
from tidemark.source.mariadb.replica_id import ReplicaIdClaim, ReplicaIdInUseError
from waiting import wait_for

_ids = itertools.count(os.getpid() % 1000 * 100 + 7000)


def _holder(mdb: MariaDatabase, server_id: int) -> int | None:
    value = mdb.query("SELECT IS_USED_LOCK(%s)", (f"tidemark.server_id.{server_id}",))[0][0]
    return None if value is None else int(value)


def _via(relay: CuttableRelay, settings: client.ConnectionSettings
         ) -> client.ConnectionSettings:
    return client.ConnectionSettings(host="127.0.0.1", port=relay.port, user=settings.user,
                                     password=settings.password, database=settings.database,
                                     connect_timeout_s=2.0)


def _keep_now(claim: ReplicaIdClaim) -> None:
    claim._pinged = 0.0  # as if the ping interval had passed
    claim.keep()


def test_the_lock_is_taken_again_after_a_cut_that_left_it_on_the_server(
        mdb: MariaDatabase) -> None:
    settings = client.parse_url(mdb.dsn)
    server_id = next(_ids)
    with CuttableRelay(settings.host, settings.port) as relay:
        claim = ReplicaIdClaim(_via(relay, settings), server_id)
        claim.claim()
        try:
            old = _holder(mdb, server_id)
            assert old is not None
            assert relay.cut() > 0
            assert _holder(mdb, server_id) == old  # the server kept it
            _keep_now(claim)  # its own old connection: ended, not a refusal
            new = _holder(mdb, server_id)
            assert new is not None and new != old
        finally:
            claim.release()


def test_a_lock_lost_while_the_server_was_unreachable_is_taken_again(
        mdb: MariaDatabase) -> None:
    settings = client.parse_url(mdb.dsn)
    server_id = next(_ids)
    relay = CuttableRelay(settings.host, settings.port)
    claim = ReplicaIdClaim(_via(relay, settings), server_id)
    claim.claim()
    try:
        relay.close()  # the connection ends, and the server cannot be reached
        wait_for(lambda: _holder(mdb, server_id) is None, 30, "the lock to go")
        _keep_now(claim)  # cannot reconnect: the dump's retries report it
        assert _holder(mdb, server_id) is None
        claim._settings = settings  # reachable again
        _keep_now(claim)
        assert _holder(mdb, server_id) is not None
        with pytest.raises(ReplicaIdInUseError):
            ReplicaIdClaim(settings, server_id).claim()
    finally:
        claim.release()


def test_keep_returns_when_the_server_stops_answering(
        mdb: MariaDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replica_id, "_IO_TIMEOUT_S", 2.0, raising=False)
    settings = client.parse_url(mdb.dsn)
    with CuttableRelay(settings.host, settings.port) as relay:
        claim = ReplicaIdClaim(_via(relay, settings), next(_ids))
        claim.claim()
        os.kill(relay._proc.pid, signal.SIGSTOP)  # nothing answers any more
        try:
            thread = threading.Thread(target=_keep_now, args=(claim,), daemon=True)
            began = time.monotonic()
            thread.start()
            thread.join(30)
            assert not thread.is_alive(), "keep() hung on a server that stopped answering"
            assert time.monotonic() - began < 30
        finally:
            os.kill(relay._proc.pid, signal.SIGCONT)
            claim.release()
