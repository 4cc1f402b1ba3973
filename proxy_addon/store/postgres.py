"""
The PostgreSQL backend: `PostgresStore`, for a fleet of proxies on one shared store.

    store = PostgresStore.open("postgresql://proxy@db.internal/receipts")   # migrated on open
    store = PostgresStore.open("host=db.internal dbname=receipts")         # libpq conninfo
    store = PostgresStore.open("postgresql://")                            # PGHOST, PGUSER, ... only

How it keeps base.py's contract: every write is one transaction that first takes one
transaction-level advisory lock (`pg_advisory_xact_lock`), so the read-then-insert of
`begin_attempt` is serialized with every other writer of every proxy on the database, waiting
at most `lock_timeout` (then StoreUnavailable: nothing forwarded). A commit is durable when it
returns (synchronous_commit is turned back on for our sessions if the server has it off), except an
outcome's and a duplicate's, which `SET LOCAL synchronous_commit = off` (base.py, "Durability").
migrations.py gives the same named migrations as SQLite, in PostgreSQL's dialect (BYTEA,
identity columns, PL/pgSQL triggers for the append-only events, deferrable foreign keys for
`prune`), recorded in `receipt_proxy_migrations`; concurrent openers migrate once under an
advisory lock. Every event appended sends `NOTIFY receipt_proxy, '<receipt id>'` at commit,
which other proxies LISTEN to (their waiting duplicates, their mitmweb).

Connections: one per store (one store per thread, as for SQLite), opened lazily and opened
again after it was lost, so a restarted PostgreSQL serves the next call without restarting
the proxy. Every psycopg error becomes a StoreError naming the database by `location`, which
never contains a password. psycopg 3 is the driver: the maintained successor of psycopg2,
with server-side parameter binding, LISTEN/NOTIFY as a generator with a timeout, and libpq's
own parsing of URLs, conninfo and the PG* variables.

Which values name a PostgreSQL database, and how messages show one without its password:
dsn.py. The instance leases: fleet.py (the mixin `PostgresFleet`); the key check, both backends': key_check.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

try:  # psycopg needs libpq (Debian's libpq5) or its binary extra: dsn.MISSING says so, and open() refuses
    import psycopg
    from psycopg import errors as pgerrors
    from psycopg.rows import dict_row
except ImportError:  # pragma: no cover - depends on the machine
    pass

from proxy_addon.errors import StoreError, StoreUnavailable
from proxy_addon.states import State
from proxy_addon.store.base import Dialect, UniqueViolation
from proxy_addon.store.dsn import MISSING, describe
from proxy_addon.store.fleet import PostgresFleet
from proxy_addon.store.migrations import apply_postgres
from proxy_addon.store.records import Clock, utcnow

CHANNEL = "receipt_proxy"  # NOTIFY channel: the payload is the id of a receipt that changed
WRITE_LOCK = 0x5EC1E7  # the advisory lock every write transaction takes (pg_advisory_xact_lock)
MIGRATE_LOCK = 0x5EC1E8  # the advisory lock migrations run under


def _placeholders(sql: str) -> str:
    """base.py's `?` placeholders as psycopg's `%s` (the SQL has no `?` or `%` in literals)."""
    return sql.replace("?", "%s")


class PostgresStore(PostgresFleet):
    """The receipts database on a PostgreSQL server. Not thread-safe: give each thread its own store."""

    dialect = Dialect(insertion_order="seq")
    reconnects = True  # a lost connection is opened again by the next call: a failed write may be tried again
    relaxes_late = True  # SET LOCAL synchronous_commit works anywhere in a transaction (base.py, "Durability")

    def __init__(self, dsn: str, *, clock: Clock = utcnow, lock_timeout: float = 5.0, connect_timeout: float = 5.0):
        self.dsn = dsn
        self.clock = clock
        self.lock_timeout = lock_timeout
        self.connect_timeout = connect_timeout
        self.conn: psycopg.Connection[dict[str, Any]] | None = None
        self._writing = False
        self._created: list[str] = []  # receipts created in the open write transaction
        self.lease: tuple[str, float] | None = None  # (instance, seconds): new receipts need it to hold
        self._location = describe(dsn)

    @classmethod
    def open(
        cls,
        dsn: str,
        *,
        lock_timeout: float = 5.0,
        clock: Clock = utcnow,
        create: bool = True,
        connect_timeout: float = 5.0,
    ) -> PostgresStore:
        """Connect to the database at `dsn` and apply pending migrations (with `create`), or check it has receipts."""
        if MISSING:
            raise StoreUnavailable(f"cannot open the receipts database {describe(dsn)}: {MISSING}")
        store = cls(dsn, clock=clock, lock_timeout=lock_timeout, connect_timeout=connect_timeout)
        conn = store._connection(writing=True)
        try:
            if create:
                apply_postgres(conn, MIGRATE_LOCK, lock_timeout)
            else:
                found = conn.execute("SELECT to_regclass('receipts') IS NOT NULL AS found").fetchone()
                if not found or not found["found"]:
                    raise StoreError(f"{store.location} is not a receipts database (no receipts table)")
        except psycopg.Error as e:
            store.close()
            raise StoreUnavailable(f"cannot open the receipts database {store.location}: {_message(e)}") from e
        except BaseException:
            store.close()
            raise
        return store

    @property
    def location(self) -> str:
        return self._location

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
            self.conn = None

    # --- the connection ----------------------------------------------------------------------

    def _connection(self, *, writing: bool) -> psycopg.Connection[dict[str, Any]]:
        """The open connection, or a new one (the last was lost, or there was none)."""
        if self.conn is not None and not self.conn.closed and not self.conn.broken:
            return self.conn
        self.close()
        try:
            conn = psycopg.connect(
                self.dsn,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=max(1, round(self.connect_timeout)),
                application_name="receipt-proxy",
            )
        except psycopg.Error as e:
            what = "write" if writing else "read"
            raise (StoreUnavailable if writing else StoreError)(
                f"cannot {what} the receipts database {self.location}: cannot connect: {_message(e)}"
            ) from e
        try:
            conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(self.lock_timeout * 1000)}ms",))
            row = conn.execute("SHOW synchronous_commit").fetchone()
            if row and row["synchronous_commit"] == "off":  # a commit must be durable before we forward
                conn.execute("SET synchronous_commit TO on")
        except psycopg.Error as e:
            conn.close()
            raise StoreUnavailable(f"cannot use the receipts database {self.location}: {_message(e)}") from e
        self.conn = conn
        return conn

    # --- the primitives (base.py) --------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self, *, durable: bool = True) -> Iterator[None]:
        """
        One transaction holding the write lock: serialized with every writer of every proxy.
        `durable=False`: with synchronous_commit off for it (base.py, "Durability").
        """
        conn = self._connection(writing=True)
        self._writing = True
        committed = False
        relax = "" if durable else "SET LOCAL synchronous_commit TO off; "
        try:
            try:  # one round trip (lock_timeout is the session's, set on connecting)
                conn.execute(f"BEGIN; {relax}SELECT pg_advisory_xact_lock({WRITE_LOCK})".encode())
            except psycopg.Error as e:
                self._rollback(e)
                raise self._failure(e) from e
            try:
                yield
            except BaseException as e:
                self._rollback(e)
                if isinstance(e, psycopg.Error):
                    raise self._failure(e) from e
                raise
            try:
                conn.execute("COMMIT")
                committed = True
            except psycopg.Error as e:
                failure = self._failure(e)
                self._rollback(e)
                created, self._created = self._created, []
                self._writing = False
                self._settled(False)  # what this transaction changed is not known to be committed
                self._settle_lost_commit(created)
                raise failure from e
        finally:
            self._writing = False
            self._created = []
            self._settled(committed)  # tell the observer (metrics) what committed; forget it otherwise

    def _relax(self) -> None:
        self._execute("SET LOCAL synchronous_commit TO off")  # this transaction only

    def _rollback(self, cause: BaseException) -> None:
        conn = self.conn
        if conn is None or conn.closed or conn.broken:
            return
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except psycopg.Error:
            self.close()  # the next call opens a new connection

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        try:
            cur = self._connection(writing=self._writing).execute(_placeholders(sql), list(params))
            return cur.fetchall() if cur.description else []
        except psycopg.Error as e:
            raise self._failure(e) from e

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        try:
            return self._connection(writing=self._writing).execute(_placeholders(sql), list(params)).rowcount
        except psycopg.Error as e:
            raise self._failure(e) from e

    def _defer_foreign_keys(self) -> None:
        self._execute("SET CONSTRAINTS ALL DEFERRED")  # until the end of the transaction

    def _event(self, operation_id: str, event: str, from_state: State | None, *args: Any, **kw: Any) -> None:
        super()._event(operation_id, event, from_state, *args, **kw)
        if from_state is None:
            self._created.append(operation_id)
        self._execute("SELECT pg_notify(?, ?)", (CHANNEL, operation_id))  # sent at commit, never on rollback

    def _settle_lost_commit(self, created: list[str]) -> None:
        """
        The connection was lost while COMMIT was on its way: the receipts this transaction
        created may exist, though the caller hears StoreUnavailable and forwards nothing. Those
        that do exist become not_sent (nothing left), so that they block no duplicate; if the
        database cannot be reached now either, they stay, and recovery handles them.
        """
        for operation_id in created:
            with contextlib.suppress(StoreError):
                self.transition(
                    operation_id,
                    State.NOT_SENT,
                    reason="the database's answer to the commit was lost: the request was not forwarded",
                    expect=[State.SUBMITTED],
                    actor="proxy",
                )

    def _failure(self, e: psycopg.Error) -> StoreError:
        """The StoreError for a psycopg error: in a write, UniqueViolation or StoreUnavailable; else a failed read."""
        if self.conn is not None and (self.conn.closed or self.conn.broken):
            self.close()  # lost: the next call connects again
        if not self._writing:
            return StoreError(f"cannot read the receipts database {self.location}: {_message(e)}")
        if isinstance(e, pgerrors.UniqueViolation):
            return UniqueViolation(f"cannot write the receipts database {self.location}: {_message(e)}")
        return StoreUnavailable(f"cannot write the receipts database {self.location}: {_message(e)}")


def _message(e: psycopg.Error) -> str:
    """The first line of a psycopg error (libpq's messages never include the password)."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
