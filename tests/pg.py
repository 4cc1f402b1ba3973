"""
A throwaway PostgreSQL for the tests (and scripts/bench): Debian's binaries (initdb, pg_ctl)
in a temporary folder, on a free loopback port, run as a user that is not root.

    cluster = Cluster.start()             # or Cluster.find(): RECEIPTS_TEST_PG, else a new one
    url = cluster.new_schema()            # a database URL whose tables live in a fresh schema
    cluster.stop(); cluster.start_again() # a PostgreSQL outage, and its end
    cluster.destroy()

`RECEIPTS_TEST_PG=postgresql://…` uses an existing server instead (it must let the tests
create schemas, and `stop` is then refused). Without either, `unavailable()` says why in one
line and the PostgreSQL tests skip with it.

PostgreSQL refuses to run as root, and tests and CI run as root: the binaries run as the
`postgres` user when it exists (Debian's package creates it), else as `receipts-pg`, created
here (useradd). The data folder is made under /tmp and given to that user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tests.upstream import free_port

ENV = "RECEIPTS_TEST_PG"
USERS = ("postgres", "receipts-pg")


def binaries() -> Path | None:
    """The folder holding initdb and pg_ctl: on PATH, else Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent if Path(found).resolve().parent.joinpath("pg_ctl").exists() else None
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if Path(d, "initdb").exists() and Path(d, "pg_ctl").exists():
            return Path(d)
    return None


def unavailable() -> str | None:
    """Why no PostgreSQL can be had for the tests, or None."""
    if os.environ.get(ENV):
        return None
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]')"
    if binaries() is None:
        return f"no initdb/pg_ctl found (apt-get install postgresql, or set {ENV}=postgresql://…)"
    if os.geteuid() == 0 and not shutil.which("runuser") and not shutil.which("setpriv"):
        return "running as root with neither runuser nor setpriv to start PostgreSQL as another user"
    return None


def _user() -> str | None:
    """The user PostgreSQL runs as (None: this one, not root); created when there is none."""
    if os.geteuid() != 0:
        return None
    for name in USERS:
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USERS[1]], check=True)
    return USERS[1]


class Cluster:
    """A PostgreSQL server for tests: one we started (stoppable), or RECEIPTS_TEST_PG's."""

    def __init__(
        self,
        *,
        url: str,
        datadir: Path | None = None,
        bindir: Path | None = None,
        user: str | None = None,
        port: int = 0,
    ):
        self.url = url  # the admin URL: the `postgres` database as a superuser
        self.datadir = datadir
        self.bindir = bindir
        self.user = user
        self.port = port

    @classmethod
    def find(cls, *, fsync: bool = False) -> Cluster:
        if os.environ.get(ENV):
            return cls(url=os.environ[ENV])
        return cls.start(fsync=fsync)

    @classmethod
    def start(cls, *, fsync: bool = False) -> Cluster:
        bindir = binaries()
        assert bindir is not None, unavailable()
        user = _user()
        root = Path(tempfile.mkdtemp(prefix="receipts-pg-"))
        datadir = root / "data"
        if user:
            shutil.chown(root, user)
        os.chmod(root, 0o700)
        port = free_port()
        cluster = cls(
            url=f"postgresql://postgres@127.0.0.1:{port}/postgres", datadir=datadir, bindir=bindir, user=user, port=port
        )
        cluster._run(
            "initdb",
            "-D",
            str(datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-instructions",
            "--no-sync",
        )
        with open(datadir / "postgresql.conf", "a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{root}'\n"
                f"fsync = {'on' if fsync else 'off'}\nfull_page_writes = {'on' if fsync else 'off'}\n"
                "max_connections = 200\nshared_buffers = 64MB\n"
            )
        cluster.start_again()
        return cluster

    def _run(self, tool: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        assert self.bindir is not None
        cmd = [str(self.bindir / tool), *args]
        if self.user:
            cmd = (
                ["runuser", "-u", self.user, "--", *cmd]
                if shutil.which("runuser")
                else ["setpriv", f"--reuid={self.user}", f"--regid={self.user}", "--init-groups", *cmd]
            )
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/")
        if p.returncode != 0:
            raise RuntimeError(f"{tool} failed ({p.returncode}): {p.stdout}\n{p.stderr}")
        return p

    @property
    def ours(self) -> bool:
        return self.datadir is not None

    def start_again(self) -> None:
        """Start (or restart after `stop`) our server and wait until it answers."""
        assert self.datadir is not None, f"{ENV} names a server the tests do not start or stop"
        self._run(
            "pg_ctl", "-D", str(self.datadir), "-l", str(self.datadir.parent / "server.log"), "-w", "-t", "60", "start"
        )
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop our server (fast shutdown: open connections are cut, as when a database goes away)."""
        assert self.datadir is not None, f"{ENV} names a server the tests do not start or stop"
        self._run("pg_ctl", "-D", str(self.datadir), "-m", "fast", "-w", "-t", "60", "stop")

    def destroy(self) -> None:
        if self.datadir is None:
            return
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._run("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "-t", "30", "stop")
        shutil.rmtree(self.datadir.parent, ignore_errors=True)

    def execute(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Run one statement on the admin database (autocommit); its rows."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def new_schema(self) -> str:
        """A database URL whose tables live in a new, empty schema of their own (cheap, isolated)."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.execute(f"CREATE SCHEMA {name}")
        return schema_url(self.url, name)

    def dump(self) -> bytes:
        """Every row of every table the tests made, as text (for the marker secrets sweep)."""
        import psycopg

        out = []
        with psycopg.connect(self.url, autocommit=True) as conn:
            tables = conn.execute(
                "SELECT table_schema, table_name FROM information_schema.tables "
                "WHERE table_schema LIKE 't\\_%' AND table_type = 'BASE TABLE'"
            ).fetchall()
            for schema, table in tables:
                for row in conn.execute(f'SELECT * FROM "{schema}"."{table}"'):
                    out += [bytes(v) if isinstance(v, bytes | memoryview) else str(v).encode() for v in row]
        return b"\n".join(out)


def schema_url(url: str, schema: str) -> str:
    """`url` with its tables in `schema` (libpq's options=-csearch_path=...)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"
