"""
The contract a receipts backend keeps, and the primitives it implements.

The receipts logic is written once, over these primitives: `ReceiptReads` (store/queries.py) and
`ReceiptStore` (receipts.py), put together from one mixin per job: transitions.py (guarded
transitions), attempts.py (deciding an attempt), store/approval_decisions.py (operators' decisions),
resolutions.py (resolve, reconcile claims), retention.py (prune), recovery.py. A backend
subclasses ReceiptStore (sqlite.py: `SQLiteStore`; postgres.py: `PostgresStore`) and provides:

    _write(durable=True, intents=None, receipt=None)
                             a context manager: one serialized write transaction. It
                             commits when the block ends and rolls back on any exception,
                             and raises StoreUnavailable when it cannot begin or commit.
                             As it ends, it calls `self._settled(committed)` (transitions.py),
                             which tells the store's `observer` the state changes committed.
                             `durable=False`: its commit need not reach the disk before it
                             returns (see "Durability" below). `intents` (names: the
                             attempt's fingerprints) or `receipt` (an id): it is
                             serialized only with writes of those intents (or of that
                             receipt's) and with whole-store ones (neither given), where
                             `locks_per_intent` (PostgreSQL); else with every writer.
    _relax()                 inside a durable `_write`: its commit need not reach the disk
                             after all; only where `relaxes_late` (PostgreSQL), else a no-op.
    _snapshot_write()        optional (`snapshot_writes`: SQLite in WAL): a transaction that
                             reads without a lock and raises WouldWait, having written
                             nothing, when its first write would wait for another writer;
                             committed as `_write(durable=False)` (`answer_duplicate`).
    _rows(sql, params)       the rows of a query, as dicts of column → value.
    _execute(sql, params)    run a statement; returns its row count.
    _defer_foreign_keys()    inside `_write`: check foreign keys at commit, not per statement.
    location                 how messages name the database (a path, a DSN without password).
    dialect                  the little SQL that differs (the column that orders receipts
                             as they were inserted: SQLite's `rowid`).
    close()

No driver error escapes a primitive. Inside `_write`, the driver's unique violation becomes
UniqueViolation (`begin_attempt` catches it and decides again) and any other driver error
StoreUnavailable (nothing was written); outside it, a failed read is a StoreError. Each
message names the database (`location`).

The SQL the base passes is standard, with `?` placeholders and no `?` or `%` inside
literals: a driver with another paramstyle (psycopg's `%s`) rewrites them. Each backend
also has its own `open` (SQLiteStore.open takes a path) and its own schema setup.

What a backend must guarantee, because the proxy's promise rests on it:

- The same schema: tables `receipts` and `receipt_events` with the columns, indexes and
  triggers that migrations.py gives SQLite (m001..m004), `receipt_events.id` growing with
  each event, and foreign keys enforced.
- `approval_decisions` (m007): at most one operator decision per receipt (its primary key),
  checked and inserted in one `_write` (`decide_approval`), and marked used in the `_write`
  that moves its receipt (`apply_approval`), so a decision is applied once or not at all.
- `budget_charges` (m014): a new receipt's share of each of its budgets is inserted in the
  `_write` that inserts the receipt (`_insert`, store/budgets.py), and the use it was checked
  against was read in that same transaction, under the budget's lock (`Charge.lock` among the
  attempt's `intents`): two decisions on one budget never both take its last unit.
- Durable before it returns: when `begin_attempt` returns "forward", the receipt and its
  first event are committed durably (SQLite: WAL with synchronous=FULL). The request is
  sent only after that.
- Durability: a transaction is durable unless `_write(durable=False)` or `_relax()` says
  otherwise, and only two kinds are not: a forwarded write's outcome (`transition(...,
  durable=False)`, from the gate) and a duplicate's answer (its `blocked`/`replayed` event in
  `begin_attempt`). Such a commit survives the proxy's crash (kill -9: it is in the
  database's log), not an OS crash or a power loss (on PostgreSQL, nor the server's crash);
  then the receipt is found `submitted`,
  which recovery makes `outcome_unknown` (the safe direction: a read, or a person, settles it;
  nothing is sent twice), and a lost duplicate's event only loses its trace. The next durable
  commit makes every commit before it durable too. SQLite: synchronous=NORMAL for the
  transaction, FULL for every other (WAL: the log is fsynced only at a FULL commit or a
  checkpoint); PostgreSQL: `SET LOCAL synchronous_commit = off` (the WAL is flushed within
  about three times wal_writer_delay, or by the next synchronous commit).
- One serialized decision per intent: `_write` serializes the read-then-insert of
  `begin_attempt` with every other writer of the same intent, even in other processes
  (SQLite: `BEGIN IMMEDIATE`, every writer; PostgreSQL: transaction-level advisory locks
  per intent taken first in the transaction, postgres.py "One winner per intent"; only a
  unique violation is retried, so a serialization failure would surface as StoreUnavailable).
  Every write that reads or changes a receipt names its intent (`intents`) or the receipt
  (`receipt`), or is a whole-store write.
- A partial unique index on `receipts(intent_fingerprint)` over the states in
  `UNRESOLVED`, so two identical attempts, even from two processes, yield one forwarded
  request. A write that loses the race raises UniqueViolation; `begin_attempt` decides again.
- Guarded transitions: every state change is `UPDATE ... WHERE operation_id = ? AND state
  IN (the legal sources)` with a row-count check, and its event is appended in the same
  transaction (`_step`). The legal sources come from `TRANSITIONS` in proxy_addon.states,
  the one transition table for every backend.
- `receipt_events` is append-only, enforced in the database (triggers refuse UPDATE, and
  DELETE while the event's receipt exists; `prune` deletes the receipt first, with foreign
  keys deferred to the commit).
- One hash chain over the events (hash_chain.py, docs/proof.md): every event is appended by
  `_append_event`, at the next position of the database's one chain, in the order the
  transactions that append them commit (PostgreSQL: CHAIN_LOCK, taken by the trigger m017 adds).
- Unknown stored states fail loudly: `Receipt.from_row` and `Event.from_row` raise StoreError.
- Every failure surfaces as a StoreError subclass (proxy_addon/errors.py), never as a
  driver's exception: StoreUnavailable for a write that did not happen (the request must
  not be forwarded), IllegalTransition, UnknownReceipt, StoreError for a failed read.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from proxy_addon.errors import StoreError, StoreUnavailable
from proxy_addon.store.records import Clock, Receipt


class WouldWait(StoreError):
    """`_snapshot_write` would have to wait for another writer: nothing was written."""


class UniqueViolation(StoreUnavailable):
    """A write hit a unique index (another writer recorded the same unresolved intent first): nothing was written."""


@dataclass(frozen=True)
class Dialect:
    """The SQL that differs between backends."""

    insertion_order: str  # a column that grows with each receipt inserted (SQLite: "rowid")


def marks(n: int) -> str:
    """`n` placeholders for an IN list: `?, ?, ?`."""
    return ", ".join("?" * n)


class Backend(abc.ABC):
    """What a backend provides (see the module docstring). Not thread-safe: one store per thread."""

    dialect: ClassVar[Dialect]
    clock: Clock
    path: str | None = None  # the SQLite file (None for a server's database)
    locks_per_intent: ClassVar[bool] = False  # whether `_write(intents=...)` leaves other intents' writers free
    reconnects: ClassVar[bool] = False  # whether a write that failed for a lost connection may be tried again
    relaxes_late: ClassVar[bool] = False  # whether `_relax` works inside a transaction (SQLite: no)
    snapshot_writes: ClassVar[bool] = False  # whether `_snapshot_write` is there (SQLite in WAL: yes)

    @abc.abstractmethod
    def close(self) -> None: ...

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """The database, as error messages name it."""

    @abc.abstractmethod
    def _write(
        self, *, durable: bool = True, intents: Sequence[str] | None = None, receipt: str | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        """One serialized write transaction (see the module docstring)."""

    def _snapshot_write(self) -> contextlib.AbstractContextManager[Any]:
        """
        A transaction that never waits (where `snapshot_writes`): it begins as a read of the
        committed state, and its first write statement makes it a write transaction, committed
        without waiting for the disk, as `_write(durable=False)`; `WouldWait` when that would
        wait (another writer holds the lock, or committed since the read began): nothing is
        written, and the caller decides in a `_write` instead.
        """
        raise NotImplementedError(f"{type(self).__name__} has no snapshot writes")

    def checkpoint(self) -> None:
        """Move what the log holds into the database now, where there is such a log (SQLite's WAL)."""
        return None  # the server's own business (PostgreSQL)

    def _relax(self) -> None:
        """Inside a durable `_write`: its commit need not be durable after all (where `relaxes_late`)."""
        if self.relaxes_late:
            raise NotImplementedError(f"{type(self).__name__} says it relaxes late, and has no _relax")

    @abc.abstractmethod
    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def _execute(self, sql: str, params: Sequence[Any] = ()) -> int: ...

    @abc.abstractmethod
    def _defer_foreign_keys(self) -> None: ...

    def _receipt(self, sql: str, params: Sequence[Any]) -> Receipt | None:
        """The first row of a query over `receipts`, as a Receipt, or None."""
        rows = self._rows(sql, params)
        return Receipt.from_row(rows[0]) if rows else None
