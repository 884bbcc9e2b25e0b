"""The throwaway-cluster helper itself: a primary that survives a kill, and a synchronous
standby that takes over with every acknowledged commit."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from pg_cluster import Cluster, Clusters, need_clusters


@pytest.fixture(scope="module")
def pg() -> Iterator[Clusters]:
    need_clusters()
    with Clusters() as made:
        yield made


def test_a_primary_keeps_its_commits_through_restarts_and_a_kill(pg: Clusters) -> None:
    primary = pg.primary()
    primary.query("CREATE TABLE t (n int)")
    primary.query("INSERT INTO t VALUES (1)")
    primary.restart("fast")
    primary.query("INSERT INTO t VALUES (2)")
    primary.restart("immediate")
    primary.query("INSERT INTO t VALUES (3)")
    pid = primary.postmaster_pid()
    primary.kill()
    assert not primary.running and pid is not None
    with pytest.raises(psycopg.OperationalError):
        primary.connect(connect_timeout=2)
    primary.start()  # crash recovery: every acknowledged commit is there (fsync on)
    assert primary.query("SELECT n FROM t ORDER BY n") == [(1,), (2,), (3,)]
    primary.stop()
    assert not primary.running


def test_a_promoted_synchronous_standby_has_every_acknowledged_commit(pg: Clusters) -> None:
    primary = pg.primary()
    standby = pg.standby(primary, sync=True)
    asynchronous = pg.standby(primary, sync=False)
    assert pg.sync_names(primary) == [standby.name]
    states = dict(primary.query("SELECT application_name, sync_state FROM pg_stat_replication"))
    assert states == {standby.name: "quorum", asynchronous.name: "async"}
    assert standby.query("SELECT pg_is_in_recovery()") == [(True,)]
    primary.query("CREATE TABLE t (n int)")
    for n in range(50):
        primary.query("INSERT INTO t VALUES (%s)", n)
    primary.kill()
    # Both hosts named; libpq tries them in order and keeps the one that accepts writes.
    both = f"postgresql://postgres@{primary.host},{standby.host}/postgres"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"{both}?target_session_attrs=read-write", connect_timeout=2)
    standby.promote()
    with psycopg.connect(f"{both}?target_session_attrs=read-write", connect_timeout=5) as conn:
        assert conn.info.port == standby.port
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (50,)
        conn.execute("INSERT INTO t VALUES (50)")  # writable, and waits for no standby
        conn.commit()


def test_clusters_are_torn_down() -> None:
    need_clusters()
    with Clusters() as made:
        cluster: Cluster = made.primary()
        pid = cluster.postmaster_pid()
        base = made.base
        assert pid is not None and base.exists()
    assert not base.exists()
    assert not cluster.running
