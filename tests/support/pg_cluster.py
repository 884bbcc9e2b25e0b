"""Throwaway PostgreSQL clusters for the tests of the journal's own faults.

Each cluster is a data directory of its own under one temporary directory, served on a free
loopback port with trust authentication and ``fsync`` on, by the server binaries found with
``pg_config --bindir`` (or ``$INTENTLOG_TEST_PG_BIN``, or the newest Debian
``/usr/lib/postgresql/N/bin``). PostgreSQL refuses to run as root, so where the tests run as root
the server processes run as the ``postgres`` user (``runuser``) and the directories belong to it.

A :class:`Clusters` context makes primaries and streaming standbys (``pg_basebackup``,
synchronous through ``synchronous_standby_names`` or asynchronous), and stops, kills, restarts
and promotes them. Every wait polls what it waits for (the server answering, a standby reported
streaming or synchronous in ``pg_stat_replication``), bounded only by a generous deadline that
fails with the server's log. On leaving the context every server still running is stopped
(``-m immediate``), any process left is killed, and the directory is removed.

References: initdb https://www.postgresql.org/docs/15/app-initdb.html, pg_ctl
https://www.postgresql.org/docs/15/app-pg-ctl.html, pg_basebackup
https://www.postgresql.org/docs/15/app-pgbasebackup.html, standby servers and synchronous
replication https://www.postgresql.org/docs/15/warm-standby.html.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from engine_servers import free_port

#: How long a wait may take before it fails with the server's log: a bound on a hang, far above
#: what any step takes even on a slow, loaded machine.
DEADLINE = 60.0

StopMode = Literal["smart", "fast", "immediate"]


class ClusterError(RuntimeError):
    """A cluster could not be made, started or brought to the state asked for."""


def bindir() -> Path:
    """The directory of the PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup)."""
    if found := os.environ.get("INTENTLOG_TEST_PG_BIN"):
        return Path(found)
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if (Path(out) / "initdb").exists():
            return Path(out)
    debian = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3])
    )
    if debian:
        return Path(debian[-1]).parent
    if found := shutil.which("initdb"):
        return Path(found).parent
    raise ClusterError(
        "no PostgreSQL server binaries (initdb, pg_ctl) found; set INTENTLOG_TEST_PG_BIN"
    )


def problem() -> str | None:
    """Why throwaway clusters cannot be made here, or None if they can."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'intentlog[postgres]')"
    try:
        found = bindir()
    except ClusterError as exc:
        return str(exc)
    missing = [b for b in ("initdb", "pg_ctl", "pg_basebackup") if not (found / b).exists()]
    if missing:
        return f"{', '.join(missing)} missing from {found}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, and there is no postgres user to run the server as"
    return None


def need_clusters() -> None:
    """Skip the calling test where clusters cannot be made, but fail where CI=true: there
    the tests of the journal's own faults must run."""
    import pytest

    if (why := problem()) is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI=true: these tests must run, not skip)", pytrace=False)
    pytest.skip(why)


class Cluster:
    """One PostgreSQL server: its data directory, port and log."""

    def __init__(self, owner: Clusters, name: str, datadir: Path, port: int) -> None:
        self._owner = owner
        self.name = name
        self.datadir = datadir
        self.port = port
        self.log = datadir.parent / f"{name}.log"

    def __repr__(self) -> str:
        return f"<Cluster {self.name} 127.0.0.1:{self.port}>"

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``, for a URL naming several hosts."""
        return f"127.0.0.1:{self.port}"

    def url(self, db: str = "postgres", **params: str) -> str:
        """A ``postgresql://`` URL of this server, as the ``postgres`` superuser."""
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://postgres@{self.host}/{db}" + (f"?{query}" if query else "")

    def connect(self, db: str = "postgres", **kwargs: Any) -> Any:
        """An autocommit psycopg connection to this server."""
        import psycopg

        kwargs.setdefault("connect_timeout", 5)
        return psycopg.connect(self.url(db), autocommit=True, **kwargs)

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Run one statement on a connection of its own; its rows (none for a command)."""
        with self.connect() as conn:
            cur = conn.execute(sql, params or None)
            return list(cur.fetchall()) if cur.description else []

    # -- processes --------------------------------------------------------------------------

    def postmaster_pid(self) -> int | None:
        """The postmaster's pid from ``postmaster.pid`` if that process is alive, else None."""
        try:
            pid = int((self.datadir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    @property
    def running(self) -> bool:
        return self.postmaster_pid() is not None

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        # -w: pg_ctl polls the postmaster until it is up or has exited (then it fails).
        self._owner.pg_ctl(
            "start", "-w", "-t", str(int(DEADLINE)), "-D", self.datadir, "-l", self.log
        )
        self.wait_ready()

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server (``pg_ctl stop -m MODE``); waits until its postmaster has exited."""
        self._owner.pg_ctl("stop", "-w", "-t", str(int(DEADLINE)), "-m", mode, "-D", self.datadir)

    def restart(self, mode: StopMode = "fast") -> None:
        """Stop (``-m MODE``) and start again, waiting until it accepts connections."""
        self.stop(mode)
        self.start()

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started, as if the host died: nothing
        of this server answers afterwards, and nothing it had not written to disk survives.

        The postmaster is stopped (SIGSTOP) first so it cannot start another child while its
        children are listed and killed."""
        pid = self.postmaster_pid()
        if pid is None:
            raise ClusterError(f"{self.name} is not running")
        os.kill(pid, signal.SIGSTOP)
        children = _children(pid)
        os.kill(pid, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        _wait(lambda: not _alive(pid) and not any(_alive(c) for c in children), self, "to die")
        # A dead postmaster leaves its lock file, which a later start honours while that pid
        # exists; where nothing reaps orphans (a container whose init does not), the killed
        # postmaster stays a zombie under that pid. A host that died would have rebooted.
        with contextlib.suppress(FileNotFoundError):
            (self.datadir / "postmaster.pid").unlink()

    def promote(self) -> None:
        """Promote this standby and wait until it accepts writes."""
        self._owner.pg_ctl("promote", "-W", "-D", self.datadir)
        self.wait_writable()

    # -- waits ------------------------------------------------------------------------------

    def wait_ready(self) -> None:
        """Wait until the server accepts connections (a standby: once it is consistent)."""

        def ready() -> bool:
            if not self.running:  # no point in waiting
                raise ClusterError(f"{self.name} is not running:\n{self.log_tail()}")
            try:
                with self.connect(connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return True
            except Exception:
                return False

        _wait(ready, self, "to accept connections")

    def wait_writable(self) -> None:
        """Wait until the server accepts connections and is out of recovery."""
        self.wait_ready()

        def writable() -> bool:
            try:
                return self.query("SELECT pg_is_in_recovery()") == [(False,)]
            except Exception:
                return False

        _wait(writable, self, "to leave recovery")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


class Clusters:
    """Makes throwaway clusters under one temporary directory; removes them all on exit::

    with Clusters() as pg:
        primary = pg.primary()
        standby = pg.standby(primary, sync=True)
        primary.kill()
        standby.promote()
    """

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self._settings = settings or {}
        self._bin = bindir()
        self._as_root = os.geteuid() == 0
        self.base = Path(tempfile.mkdtemp(prefix="intentlog-pg-"))
        self.clusters: list[Cluster] = []
        self._count = 0
        self._template: Path | None = None
        if self._as_root:
            entry = pwd.getpwnam("postgres")
            self._uid, self._gid = entry.pw_uid, entry.pw_gid
            os.chown(self.base, self._uid, self._gid)

    def __enter__(self) -> Clusters:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop every server (immediate), kill what is left, remove the directory."""
        for cluster in self.clusters:
            if cluster.running:
                with contextlib.suppress(Exception):
                    cluster.stop("immediate")
            if cluster.running:
                with contextlib.suppress(Exception):
                    cluster.kill()
        shutil.rmtree(self.base, ignore_errors=True)

    # -- running the binaries -------------------------------------------------------------------

    def run(self, binary: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL binary, or cp (as the ``postgres`` user where we are root); raises
        ClusterError with its output if it fails."""
        program = binary if binary == "cp" else str(self._bin / binary)
        argv = [program, *map(str, args)]
        if self._as_root:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        # The server's user may not be able to enter the test's working directory.
        done = subprocess.run(argv, cwd=self.base, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ClusterError(
                f"{binary} {' '.join(map(str, args))} exited {done.returncode}:\n"
                f"{done.stdout}{done.stderr}"
            )
        return done

    def pg_ctl(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        return self.run("pg_ctl", *args)

    def _new(self, name: str | None) -> tuple[str, Path]:
        self._count += 1
        name = name or f"pg{self._count}"
        if any(c.name == name for c in self.clusters):
            raise ClusterError(f"a cluster named {name!r} exists already")
        return name, self.base / name

    def _configure(self, datadir: Path, lines: dict[str, str]) -> None:
        # postgresql.auto.conf is read last, so these override whatever a base backup copied.
        # https://www.postgresql.org/docs/15/config-setting.html#CONFIG-SETTING-CONFIGURATION-FILE
        with (datadir / "postgresql.auto.conf").open("a") as conf:
            for key, value in lines.items():
                conf.write(f"{key} = '{value}'\n")

    def _start_on_free_port(self, cluster: Cluster) -> None:
        for _ in range(5):
            self._configure(cluster.datadir, {"port": str(cluster.port)})
            try:
                cluster.start()
                return
            except ClusterError as exc:
                if "already in use" not in f"{exc}{cluster.log_tail()}":
                    raise
                cluster.port = free_port()  # lost the port to another process: another one
        raise ClusterError(f"{cluster.name}: no free port after 5 tries")

    # -- making clusters ------------------------------------------------------------------------

    def primary(self, name: str | None = None, **settings: str) -> Cluster:
        """initdb a new cluster (trust auth, fsync on, small memory) and start it."""
        name, datadir = self._new(name)
        if self._template is None:
            self._template = self.base / "template"
            self.run(
                "initdb", "-D", self._template, "-U", "postgres", "--auth=trust",
                "--encoding=UTF8", "--locale=C", "--no-instructions",
                # Small WAL segments: each new one is written out in full before use.
                "--wal-segsize=1",
                # Only initdb's own flush of the new files is skipped: the server runs with
                # fsync on, and a copy of a cluster that never ran is a new cluster.
                "--no-sync",
            )  # fmt: skip
        self.run("cp", "-a", self._template, datadir)
        cluster = Cluster(self, name, datadir, free_port())
        self.clusters.append(cluster)
        self._configure(
            datadir,
            {
                "listen_addresses": "127.0.0.1",
                "unix_socket_directories": "",
                "fsync": "on",
                "synchronous_commit": "on",
                "shared_buffers": "16MB",
                "max_connections": "60",
                "wal_level": "replica",
                "max_wal_senders": "5",
                "max_replication_slots": "5",
                "wal_keep_size": "32MB",
                "min_wal_size": "4MB",
                "max_wal_size": "64MB",
                "cluster_name": name,
                **self._settings,
                **settings,
            },
        )
        self._start_on_free_port(cluster)
        return cluster

    def standby(
        self, primary: Cluster, *, sync: bool, name: str | None = None, **settings: str
    ) -> Cluster:
        """A streaming standby of ``primary``, made with ``pg_basebackup``, started, and
        waited for until ``pg_stat_replication`` on the primary shows it streaming.

        ``sync=True`` adds it to the primary's ``synchronous_standby_names`` (so a commit on
        the primary returns only once this standby has flushed it) and waits until the
        primary reports it ``sync``; ``sync=False`` leaves the primary's setting as it is."""
        name, datadir = self._new(name)
        self.run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
            "-D", datadir, "-X", "stream", "--checkpoint=fast", "--no-sync",
        )  # fmt: skip
        (datadir / "standby.signal").touch()
        if self._as_root:
            os.chown(datadir / "standby.signal", self._uid, self._gid)
        cluster = Cluster(self, name, datadir, free_port())
        self.clusters.append(cluster)
        # application_name is what synchronous_standby_names matches against.
        conninfo = f"host=127.0.0.1 port={primary.port} user=postgres application_name={name}"
        self._configure(
            datadir,
            {
                "primary_conninfo": conninfo.replace("'", "''"),
                "cluster_name": name,
                "hot_standby": "on",
                # Once promoted it has no standby of its own: it must not wait for one.
                "synchronous_standby_names": "",
                **settings,
            },
        )
        self._start_on_free_port(cluster)
        if sync:
            names = [n for n in self.sync_names(primary) if n != name] + [name]
            self.set_sync_names(primary, names)
        # Under ANY n (...), a standby that counts towards the quorum is reported 'quorum'.
        want = ("sync", "quorum") if sync else None
        _wait(lambda: self._replication_state(primary, name, want), cluster, "to stream")
        return cluster

    @staticmethod
    def sync_names(primary: Cluster) -> list[str]:
        """The standbys named in the primary's ``synchronous_standby_names``."""
        ((value,),) = primary.query("SHOW synchronous_standby_names")
        inner = str(value)
        if "(" in inner:  # ANY 1 (a, b) or FIRST 1 (a, b)
            inner = inner[inner.index("(") + 1 : inner.rindex(")")]
        return [n.strip().strip('"') for n in inner.split(",") if n.strip()]

    @staticmethod
    def set_sync_names(primary: Cluster, names: list[str]) -> None:
        """Set the primary's ``synchronous_standby_names`` (any one of ``names`` acknowledges
        a commit; none: commits wait for no standby) and wait until it is in force."""
        # ANY 1 (...): a commit waits for one of them.
        # https://www.postgresql.org/docs/15/runtime-config-replication.html#GUC-SYNCHRONOUS-STANDBY-NAMES
        quoted = ", ".join(f'"{n}"' for n in names)
        value = f"ANY 1 ({quoted})" if names else ""
        primary.query(f"ALTER SYSTEM SET synchronous_standby_names = '{value}'")
        primary.query("SELECT pg_reload_conf()")
        _wait(lambda: Clusters.sync_names(primary) == names, primary, "to apply the setting")

    @staticmethod
    def _replication_state(
        primary: Cluster, name: str, sync_states: tuple[str, ...] | None
    ) -> bool:
        try:
            rows = primary.query(
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                name,
            )
        except Exception:
            return False
        return any(
            state == "streaming" and (sync_states is None or sync in sync_states)
            for state, sync in rows
        )


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = Path(stat).read_text()
            # The command name is in parentheses and may hold spaces: split after it.
            fields = text[text.rindex(")") + 2 :].split()
            if int(fields[1]) == pid:
                found.append(int(Path(stat).parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        # A killed child of ours stays a zombie until reaped; it no longer runs.
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _wait(done: Callable[[], bool], cluster: Cluster, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not done():
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{cluster.name} took over {DEADLINE:.0f} s {what}:\n{cluster.log_tail()}"
            )
        time.sleep(0.02)


@contextlib.contextmanager
def clusters(**settings: str) -> Iterator[Clusters]:
    """``with clusters() as pg:`` -- a :class:`Clusters`, closed on leaving."""
    with Clusters(settings) as made:
        yield made
