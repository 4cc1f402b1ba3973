"""
The SQLite backend: `SQLiteStore` (the `Store` everything uses today).

    store = SQLiteStore.open("receipts.db")    # mode 0600, WAL, synchronous=FULL, migrated

How it keeps base.py's contract: every write is one `BEGIN IMMEDIATE` transaction (serialized
with every other writer, even in other processes, waiting up to `lock_timeout`); WAL with
synchronous=FULL makes a commit durable before `begin_attempt` returns (an outcome and a
duplicate's event commit with NORMAL: base.py, "Durability"); migrations.py holds
the schema (the partial unique index, the append-only triggers); foreign keys are on.
Every sqlite3.Error becomes a StoreError that names the database file.

The store knows it is the same store: it records the database file's identity (device,
inode) when it opens it, and its WAL's after the first write, and checks both before every
write transaction. A file removed or replaced under a running proxy (`rm receipts.db*`, a
restore over it) makes every write StoreUnavailable, so nothing is forwarded, instead of
writing receipts into an unlinked file that no other process will ever read.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from sqlite_utils import Database

from proxy_addon.errors import StoreError, StoreUnavailable
from proxy_addon.store.base import Dialect, UniqueViolation, WouldWait
from proxy_addon.store.migrations import migrations
from proxy_addon.store.receipts import ReceiptStore
from proxy_addon.store.records import Clock, utcnow

_UNIQUE = frozenset({sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY})
_BUSY = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})  # primary codes (BUSY_SNAPSHOT is BUSY's)


class SQLiteStore(ReceiptStore):
    """The receipts database in one SQLite file. Not thread-safe: give each thread its own store."""

    dialect = Dialect(insertion_order="rowid")
    snapshot_writes = True  # in WAL mode (open sets it): a read transaction becomes a write, or says it would wait

    def __init__(self, conn: sqlite3.Connection, *, clock: Clock = utcnow, path: str | None = None):
        self.db = Database(conn)
        self.conn = conn
        self.clock = clock
        self.path = path
        self._writing = False
        self._snapshot = False  # in a _snapshot_write: a busy database is WouldWait
        # Taken around each write transaction by this process's connections to this file (`writes_with`):
        # between them a mutex, not SQLite's busy handler, which sleeps a millisecond or more.
        self._writers = threading.Lock()
        self._holds_writers = False
        self._durable = True  # the connection's synchronous level: FULL (open sets it), or NORMAL
        self._identity = _identity(path) if path else None  # (device, inode) of the file opened
        self._wal_identity: tuple[int, int] | None = None  # the WAL's, once a write has made it

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        lock_timeout: float = 5.0,
        clock: Clock = utcnow,
        create: bool = True,
        checkpoints: bool = True,
        writes_with: SQLiteStore | None = None,
    ) -> SQLiteStore:
        """
        Open (and create with mode 0600, and migrate) the receipts database at `path`.
        `checkpoints=False`: this connection's commits never checkpoint the WAL (one on the event
        loop, which must not wait for the disk; the store's own connection checkpoints it).
        `writes_with`: another connection of this process to the file, whose writes this one's
        exclude with a mutex: its `_write` waits on it, a `_snapshot_write` says WouldWait.
        """
        p = Path(path).expanduser()
        try:
            if create:
                _create_private_file(p)
            elif not p.exists():
                raise StoreError(f"no receipts database at {p}")
            conn = sqlite3.connect(p, timeout=lock_timeout, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute(f"PRAGMA busy_timeout={int(lock_timeout * 1000)}")
            if not checkpoints:
                conn.execute("PRAGMA wal_autocheckpoint=0")
            store = cls(conn, clock=clock, path=str(p))
            if writes_with is not None:
                store._writers = writes_with._writers
            if create:
                # Switching a new file to WAL can fail with "locked" without waiting for the busy
                # timeout when other connections are opening it too: retry within lock_timeout.
                _retry_while_locked(store._setup, lock_timeout)
            elif not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'receipts'").fetchone():
                conn.close()
                raise StoreError(f"{p} is not a receipts database")
        except sqlite3.Error as e:
            raise StoreUnavailable(f"cannot open the receipts database {p}: {e}") from e
        except OSError as e:
            raise StoreUnavailable(f"cannot create the receipts database {p}: {e.strerror}") from e
        return store

    def _setup(self) -> None:
        """WAL mode (persistent: readers need not set it) and pending migrations, serialized with every other opener."""
        self.conn.execute("PRAGMA journal_mode=WAL")
        if migrations.pending(self.db):
            # apply() re-reads what is pending inside the lock; its transactions nest as savepoints.
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                migrations.apply(self.db)
                self.conn.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        try:
            self.conn.close()
        except sqlite3.Error as e:
            raise StoreError(f"cannot close the receipts database {self.location}: {e}") from e

    @property
    def location(self) -> str:
        if self.path:
            return self.path
        with contextlib.suppress(sqlite3.Error):
            for _, name, file in self.conn.execute("PRAGMA database_list"):
                if name == "main" and file:
                    return file
        return "(unnamed SQLite database)"

    # --- the primitives (base.py) --------------------------------------------------------------

    def _check_same_file(self) -> None:
        """StoreUnavailable when the database file or its WAL is no longer the one this store opened."""
        if not self.path or self._identity is None:
            return
        for name, recorded in ((self.path, self._identity), (f"{self.path}-wal", self._wal_identity)):
            if recorded is None:
                continue
            now = _identity(name)
            if now != recorded:
                what = "removed" if now is None else "replaced by another file"
                raise StoreUnavailable(
                    f"the receipts database file {name} was {what} while this process had it open: nothing is "
                    "written or forwarded until the proxy is restarted on the database it should use "
                    "(docs/operations.md: 'Starting over')"
                )

    @contextlib.contextmanager
    def _write(
        self, *, durable: bool = True, intents: Sequence[str] | None = None, receipt: str | None = None
    ) -> Iterator[None]:
        """
        One `BEGIN IMMEDIATE` transaction: serialized with every other writer, even in other
        processes, whatever its `intents` or `receipt` (one file, one writer). Durable: committed
        with synchronous=FULL (the WAL is fsynced before COMMIT returns). `durable=False`: with
        synchronous=NORMAL (no fsync; the next FULL commit, or a checkpoint, makes it durable:
        base.py, "Durability").
        """
        self._check_same_file()
        self._writers.acquire()  # this process's other connection (the event loop's) never makes us sleep
        try:
            with self._transaction("BEGIN IMMEDIATE", durable, snapshot=False):
                yield
        finally:
            self._writers.release()

    @contextlib.contextmanager
    def _transaction(self, begin: str, durable: bool, *, snapshot: bool) -> Iterator[None]:
        """`begin`, then COMMIT, or roll back and raise (`_abort`); the observer is told what committed."""
        self._begin(begin, durable)
        self._writing, self._snapshot = True, snapshot
        committed = False
        try:
            yield
            self._commit()
            committed = True
        except BaseException as e:
            self._abort(e)
        finally:
            self._writing = self._snapshot = False
            if self._holds_writers:  # a _snapshot_write's first write took this process's writers' mutex
                self._holds_writers = False
                self._writers.release()
            self._settled(committed)

    def _begin(self, sql: str, durable: bool) -> None:
        try:
            self._synchronous(durable)  # a pragma SQLite refuses inside a transaction: set before BEGIN
            self.conn.execute(sql)
        except sqlite3.Error as e:
            raise self._failure(e, writing=True) from e

    def _commit(self) -> None:
        self.conn.execute("COMMIT")
        if self._wal_identity is None and self.path:
            self._wal_identity = _identity(f"{self.path}-wal")

    def _abort(self, e: BaseException) -> NoReturn:
        """Roll back after `e`, and raise it: an SQLite error as the store's own failure."""
        self._rollback(e)
        if isinstance(e, sqlite3.Error):
            raise self._failure(e) from e
        raise e

    @contextlib.contextmanager
    def _snapshot_write(self) -> Iterator[None]:
        """
        base.py's `_snapshot_write`: a deferred `BEGIN`. Its first read takes a snapshot of the
        committed state (WAL: without a lock); its first write takes the write lock, which
        SQLite refuses at once (SQLITE_BUSY_SNAPSHOT) when another connection committed since
        that snapshot, and, on a store opened with lock_timeout=0 (`open(..., waits=False)`), when
        another writer holds it (SQLITE_BUSY), or this process's other connection writes (its
        `writes_with` mutex): WouldWait, nothing written. A commit needs no disk wait
        (synchronous=NORMAL), and the next FULL commit makes it durable.
        """
        self._check_same_file()
        with self._transaction("BEGIN", False, snapshot=True):
            yield

    def checkpoint(self) -> None:
        """
        A PASSIVE checkpoint of the WAL (it waits for no reader or writer): for the commits of a
        connection opened with checkpoints=False, which never checkpoints at its own commits.
        """
        try:
            self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as e:
            raise self._failure(e, writing=True) from e

    def _synchronous(self, durable: bool) -> None:
        """synchronous=FULL for a durable transaction, NORMAL for another; the pragma runs only when it changes."""
        if self._durable is not durable:
            self.conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self._durable = durable  # only once the pragma took: a failed switch to FULL is tried again

    def _rollback(self, cause: BaseException) -> None:
        try:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        except sqlite3.Error as e:
            raise self._failure(e) from cause

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        try:
            cursor = self.conn.execute(sql, params)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        except sqlite3.Error as e:
            raise self._failure(e) from e

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        if self._snapshot and not self._holds_writers:  # the first write of a _snapshot_write
            if not self._writers.acquire(blocking=False):
                raise WouldWait(f"the receipts database {self.location} is being written by this process")
            self._holds_writers = True
        try:
            return self.conn.execute(sql, params).rowcount
        except sqlite3.Error as e:
            raise self._failure(e) from e

    def _defer_foreign_keys(self) -> None:
        self._execute("PRAGMA defer_foreign_keys = ON")  # reset by SQLite at the end of the transaction

    def _failure(self, e: sqlite3.Error, *, writing: bool | None = None) -> StoreError:
        """
        The StoreError for a sqlite3 error: in a snapshot write, a busy database is WouldWait; in a
        write, UniqueViolation or StoreUnavailable; else a failed read.
        """
        if self._snapshot and getattr(e, "sqlite_errorcode", 0) & 0xFF in _BUSY:
            return WouldWait(f"the receipts database {self.location} is being written: {e}")
        if not (self._writing if writing is None else writing):
            return StoreError(f"cannot read the receipts database {self.location}: {e}")
        if isinstance(e, sqlite3.IntegrityError) and e.sqlite_errorcode in _UNIQUE:
            return UniqueViolation(f"cannot write the receipts database {self.location}: {e}")
        return StoreUnavailable(f"cannot write the receipts database {self.location}: {e}")


def _identity(path: str | Path) -> tuple[int, int] | None:
    """(device, inode) of a file, or None when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _create_private_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)


def _retry_while_locked(fn: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
