"""
The PostgreSQL backend: `PostgresStore`, for a fleet of proxies on one shared store.

    store = PostgresStore.open("postgresql://proxy@db.internal/receipts")   # migrated on open
    store = PostgresStore.open("host=db.internal dbname=receipts")         # libpq conninfo
    store = PostgresStore.open("postgresql://")                            # PGHOST, PGUSER, ... only

How it keeps base.py's contract: every write is one transaction that first takes its
transaction-level advisory locks (`pg_advisory_xact_lock`), waiting at most `lock_timeout` (then
StoreUnavailable: nothing forwarded), and decisions of different intents run in parallel ("One
winner per intent" below). A commit is durable when it
returns (synchronous_commit is turned back on for our sessions if the server has it off), except an
outcome's and a duplicate's, which `SET LOCAL synchronous_commit = off` (base.py, "Durability").
migrations.py gives the same named migrations as SQLite, in PostgreSQL's dialect (BYTEA,
identity columns, PL/pgSQL triggers for the append-only events, deferrable foreign keys for
`prune`), recorded in `receipt_proxy_migrations`; concurrent openers migrate once under an
advisory lock. Every event appended sends `NOTIFY receipt_proxy, '<receipt id>'` once its
transaction has committed, which other proxies LISTEN to (their waiting duplicates, their
mitmweb). A NOTIFY takes a lock that is one for the whole PostgreSQL cluster, from its
transaction's commit until that commit returns (async.c, PreCommit_Notify: queue entries in
commit order), so sent inside a durable write it would queue every proxy's commits, WAL flush
included, one behind the other. A durable write's NOTIFYs are sent after its commit, in a
transaction of their own that does not wait for the disk (lost only if the connection is lost
between the two: the waiters also poll); a write that does not wait for the disk (an outcome,
a duplicate's answer) sends them inside, with its COMMIT, in the same round trip.

Connections: one per store (one store per thread, as for SQLite), opened lazily and opened
again after it was lost, so a restarted PostgreSQL serves the next call without restarting
the proxy. Every psycopg error becomes a StoreError naming the database by `location`, which
never contains a password. psycopg 3 is the driver: the maintained successor of psycopg2,
with server-side parameter binding, LISTEN/NOTIFY as a generator with a timeout, and libpq's
own parsing of URLs, conninfo and the PG* variables.

One winner per intent. The locks a write transaction takes, all at its start, in this order:

  1. WRITE_LOCK: exclusive for a write of the whole store (`_write()`: prune, the key check, the
     fingerprint rules); shared for a write scoped to intents (`_write(intents=...)`) or to one
     receipt (`_write(receipt=...)`), so those run together, and never beside a whole-store one.
  2. One exclusive lock per intent, on `intent_key` (the first 64 bits of SHA-256) of each name, in
     ascending key order: `begin_attempt` names every fingerprint the attempt's intent may be
     recorded under (`Attempt.fingerprints`: today's and the earlier schemes' and rules') and its
     client key ("key:<client_key>") and its budgets' locks ("budget:...", `Charge.lock`: a budget's
     decisions, store/budgets.py, are serialized across the fleet); a receipt-scoped write (every
     transition, an interim answer, an approval, a resolution, a reconcile claim, a takeover by
     `recover_in_flight`) locks its receipt's `intent_fingerprint`, computed by the server from the
     row (`KEY_SQL`); if its snapshot has no such row (an unknown id, or an insert committing
     meanwhile), the transaction begins again as a whole-store one.
  3. Then row locks, by the statements themselves (a budget's use rows in one order: store/budgets.py).

Claim: for every intent, the write transactions that read or change its receipts are serialized,
in commit order, exactly as every write was under the single lock before. A receipt's
`intent_fingerprint` never changes, and a transaction reads or writes only receipts under the
fingerprints it locked (begin_attempt: its `_of_intent` read covers exactly `Attempt.fingerprints`;
a receipt-scoped write: its receipt), or holds WRITE_LOCK exclusively. Two transactions touching a
receipt under fingerprint f therefore both hold lock(f) (or one holds WRITE_LOCK exclusively, which
excludes the other's shared hold): one waits until the other has committed or rolled back.
PostgreSQL makes a commit visible (ProcArrayEndTransaction) before it releases the transaction's
locks, and the waiter's next statement (READ COMMITTED: a snapshot per statement) is taken after
its lock was granted, so it reads what the first committed. Hence two `begin_attempt`s D1, D2 of
one intent never both read "no unresolved receipt": D2 can see the receipt D1 inserts only if that
receipt's fingerprint (D1's today's) is among D2's `Attempt.fingerprints`, and then both hold its
lock, so D2 reads it and is answered as a duplicate, whatever other fingerprints either names (a
proxy that knows an earlier scheme's fingerprint, one that does not). The partial unique index on
unresolved receipts stays as the second line: a second unresolved receipt under one fingerprint is
refused even so. A `key_conflict` answer on a receipt of another intent
(the same Idempotency-Key) first adds that intent's lock and decides again (attempts.py), so that
its `blocked` event is appended under the receipt's own lock; the client key's lock serializes two
attempts that share a key, so one of them sees the other's receipt.

Deadlock freedom: advisory locks are all taken first, WRITE_LOCK then intent keys in ascending
order (a global order: no cycle among them), and a transaction waits for a row lock only after it
holds all of them. The rows it then locks are its intents' receipts (no other transaction of ours
holds those: they would hold the intent's lock), its own lease row, approval decisions of its
receipt, and the foreign-key share locks of its own receipts: a wait for a row never closes a cycle.
PostgreSQL's deadlock detector stays the backstop (an error: StoreUnavailable, nothing forwarded).

Commit order across intents is not receipt order: two intents' transactions commit in either
order. Events are chained (hash_chain.py, docs/proof.md): a transaction's events are inserted with
its COMMIT, in one round trip (`_commit_sql`), and the trigger receipt_events_chained (m017) takes
CHAIN_LOCK, an advisory lock held to the commit's end, reads the chain's tip and gives each event
its id and position under it: event ids follow the chain, which follows commit order. CHAIN_LOCK
is the last lock a transaction takes and it waits for nothing while holding it but its own commit:
no cycle. Before the chain, an event id could become visible after a higher one. The one reader that follows ids
across receipts, mitm/watch.py (mitmweb's markers), reads again the last LOOKBACK ids each tick for
that reason; NOTIFY wakes waiters by receipt id, whatever the order.

A fleet that mixes proxies of before and after this change stays correct: an older proxy takes
WRITE_LOCK exclusively in every write transaction, which excludes every newer one's shared hold,
so each older transaction is serialized with every other, and newer ones among themselves by intent.

Which values name a PostgreSQL database, and how messages show one without its password:
dsn.py. The instance leases: fleet.py (the mixin `PostgresFleet`); the key check, both backends': key_check.py.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

try:  # psycopg needs libpq (Debian's libpq5) or its binary extra: dsn.MISSING says so, and open() refuses
    import psycopg
    import psycopg.sql
    from psycopg import errors as pgerrors
    from psycopg.rows import dict_row
except ImportError:  # pragma: no cover - depends on the machine
    pass

from proxy_addon.errors import StoreError, StoreUnavailable
from proxy_addon.states import State
from proxy_addon.store.base import Dialect, UniqueViolation
from proxy_addon.store.dsn import MISSING, describe
from proxy_addon.store.fleet import PostgresFleet
from proxy_addon.store.hash_chain import CHAIN_LOCK, TIP_SQL, tip_of
from proxy_addon.store.migrations import apply_postgres
from proxy_addon.store.records import Clock, utcnow

CHANNEL = "receipt_proxy"  # NOTIFY channel: the payload is the id of a receipt that changed
WRITE_LOCK = 0x5EC1E7  # every write transaction's first lock: exclusive for the whole store, else shared
# An intent's lock key from its receipt's row, as `intent_key` computes it from the fingerprint.
KEY_SQL = "('x' || left(encode(sha256(convert_to(intent_fingerprint, 'UTF8')), 'hex'), 16))::bit(64)::bigint"
MIGRATE_LOCK = 0x5EC1E8  # the advisory lock migrations run under


def intent_key(name: str) -> int:
    """The advisory lock key of an intent (a fingerprint, or "key:<client key>"): SHA-256's first 64 bits, signed."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def _placeholders(sql: str) -> str:
    """base.py's `?` placeholders as psycopg's `%s` (the SQL has no `?` or `%` in literals)."""
    return sql.replace("?", "%s")


class PostgresStore(PostgresFleet):
    """The receipts database on a PostgreSQL server. Not thread-safe: give each thread its own store."""

    dialect = Dialect(insertion_order="seq")
    locks_per_intent = True  # decisions of different intents run in parallel (module docstring)
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
        self._notifies: list[str] = []  # receipts the open write transaction appended events to
        self._pending_events: list[dict[str, Any]] = []  # its events, inserted with its COMMIT
        self._durable = True  # whether the open write transaction's commit waits for the disk
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
    def _write(
        self, *, durable: bool = True, intents: Sequence[str] | None = None, receipt: str | None = None
    ) -> Iterator[None]:
        """
        One transaction holding its locks (module docstring, "One winner per intent"): `intents`
        (the names of intents), or `receipt` (its receipt's intent), or neither: the whole store,
        serialized with every writer of every proxy. `durable=False`: with synchronous_commit off
        for it (base.py, "Durability").
        """
        conn = self._connection(writing=True)
        self._writing = True
        committed = False
        self._durable = durable
        try:
            try:  # one round trip (lock_timeout is the session's, set on connecting)
                cur = conn.execute(self._begin_sql(durable, intents, receipt))
                while receipt is not None and cur.nextset():
                    pass  # to the last statement's result: the receipt's lock
                if receipt is not None and cur.rowcount != 1:
                    # No such receipt when the lock was taken (an unknown id, or one whose insert was
                    # committing): the whole store's lock instead, so that no read of it goes unlocked.
                    conn.execute("ROLLBACK")
                    conn.execute(self._begin_sql(durable, None, None))
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
                conn.execute(self._commit_sql())
                committed = True
            except psycopg.Error as e:
                self._notifies = []
                failure = self._failure(e)
                self._rollback(e)
                created, self._created = self._created, []
                self._writing = False
                self._settled(False)  # what this transaction changed is not known to be committed
                self._settle_lost_commit(created)
                raise failure from e
            self._notify()
        finally:
            self._writing = False
            self._created = []
            self._notifies = []
            self._pending_events = []
            self._settled(committed)  # tell the observer (metrics) what committed; forget it otherwise

    def _commit_sql(self) -> bytes:
        """
        The events kept for the commit (`_append_event`), then COMMIT; a transaction whose commit
        does not wait for the disk sends its NOTIFYs in it (the cluster's notify lock is then held
        for no WAL flush), a durable one after it (`_notify`).
        """
        statements = self._events_sql()
        if not self._durable and self._notifies:
            statements.append(self._notify_sql(self._notifies))
            self._notifies = []
        return "; ".join([*statements, "COMMIT"]).encode()

    def _notify_sql(self, ids: list[str]) -> str:
        assert self.conn is not None
        payloads = ", ".join(psycopg.sql.Literal(i).as_string(self.conn) for i in dict.fromkeys(ids))
        return f"SELECT pg_notify('{CHANNEL}', x) FROM unnest(ARRAY[{payloads}]::text[]) AS x"

    def _notify(self) -> None:
        """
        After a durable commit: NOTIFY each receipt it appended events to, in a transaction of its
        own that does not wait for the disk (module docstring). Best effort: the waiters poll as well.
        """
        ids, self._notifies = self._notifies, []
        if not ids or self.conn is None:
            return
        try:
            self.conn.execute(f"BEGIN; SET LOCAL synchronous_commit TO off; {self._notify_sql(ids)}; COMMIT".encode())
        except psycopg.Error as e:
            self._rollback(e)

    def _begin_sql(self, durable: bool, intents: Sequence[str] | None, receipt: str | None) -> bytes:
        """BEGIN and the transaction's locks, in their order (module docstring), as one simple query."""
        statements = ["BEGIN"]
        if not durable:
            statements.append("SET LOCAL synchronous_commit TO off")
        if intents is None and receipt is None:
            statements.append(f"SELECT pg_advisory_xact_lock({WRITE_LOCK})")
        else:
            if intents is not None and receipt is not None:
                raise ValueError("a write is scoped to intents or to one receipt, not both")
            statements.append(f"SELECT pg_advisory_xact_lock_shared({WRITE_LOCK})")
            keys = sorted({intent_key(i) for i in intents or ()})  # ascending: the one order (no deadlock)
            statements += [f"SELECT pg_advisory_xact_lock({k})" for k in keys]
            if receipt is not None:
                literal = psycopg.sql.Literal(receipt).as_string(self.conn)
                statements.append(
                    f"SELECT pg_advisory_xact_lock({KEY_SQL}) FROM receipts WHERE operation_id = {literal}"
                )
        return "; ".join(statements).encode()

    def _relax(self) -> None:
        self._execute("SET LOCAL synchronous_commit TO off")  # this transaction only
        self._durable = False

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

    next_event_id = "SELECT 0 AS id"  # a chain mark has no event id; the trigger gives events theirs

    def _append_event(self, fields: dict[str, Any]) -> None:
        """
        Kept until the commit, and sent with it in one round trip (`_commit_sql`): the trigger
        receipt_events_chained (m017, hash_chain.py) takes CHAIN_LOCK and chains each event as it
        is inserted, so the lock is held for no round trip to this process. No write of ours reads
        its own transaction's events back.
        """
        self._pending_events.append(fields)

    def _events_sql(self) -> list[str]:
        """The INSERTs of the events kept for the commit, with their values as literals."""
        assert self.conn is not None
        pending, self._pending_events = self._pending_events, []
        return [
            f"INSERT INTO receipt_events ({', '.join(e)}) VALUES "
            f"({', '.join(psycopg.sql.Literal(v).as_string(self.conn) for v in e.values())})"
            for e in pending
        ]

    def _chain_next(self) -> tuple[int, str, int]:
        """A chain mark's position (prune's): CHAIN_LOCK and the tip read each time (the trigger chains events)."""
        pos, prev, event_id = self._chain_start()
        return pos + 1, prev, event_id

    def _chain_start(self) -> tuple[int, str, int]:
        """
        CHAIN_LOCK, then the tip and the next event id, in one round trip: each statement of a
        simple query reads its own snapshot (READ COMMITTED), so the tip is read once the lock is
        held, and includes every chained transaction that committed before (hash_chain.py).
        """
        conn = self._connection(writing=True)
        try:
            cur = conn.execute(f"SELECT pg_advisory_xact_lock({CHAIN_LOCK}); {TIP_SQL}; {self.next_event_id}".encode())
            cur.nextset()
            tip = tip_of(cur.fetchall())
            cur.nextset()
            row = cur.fetchone()
        except psycopg.Error as e:
            raise self._failure(e) from e
        assert row is not None
        return tip[0], tip[1], int(row["id"])

    def _event(self, operation_id: str, event: str, from_state: State | None, *args: Any, **kw: Any) -> None:
        super()._event(operation_id, event, from_state, *args, **kw)
        if from_state is None:
            self._created.append(operation_id)
        self._notifies.append(operation_id)  # sent once the transaction committed (`_notify`), never on rollback

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
