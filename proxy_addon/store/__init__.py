"""
The receipts store: every SQL statement and every state change of receipt-proxy.

    store = Store.open("receipts.db")
    decision = store.begin_attempt(attempt)      # committed before it returns
    if decision.kind == "forward":
        ...send once...
        store.transition(decision.receipt.operation_id, State.SUCCEEDED, reason="HTTP 201")

    records.py      the values: Attempt, Interim, Receipt, RecordedResponse, StoredAnswer, Event, Decision,
                    ApprovalDecision; time helpers
    base.py         what a backend must guarantee, and the primitives it implements
    store/queries.py        the reads, written once over those primitives
    receipts.py     `ReceiptStore`, which backends subclass, put together from the mixins below
    transitions.py  guarded transitions and their events, and the observer told of them
    attempts.py     the hot path: deciding an attempt (`begin_attempt`)
    store/rounds.py      answers that are not outcomes: an MCP call waiting for input, or for its task
    store/approval_decisions.py    operators' decisions on held writes (`decide_approval`, `apply_approval`)
    resolutions.py  settling an unknown outcome by hand (`resolve`) or claiming it for a read
    retention.py    pruning old resolved receipts (`prune`)
    recovery.py     moving on what a stopped proxy left in flight (`recover_in_flight`)
    key_check.py    the check value of the installation's secret.key, which a database keeps
    sealing.py      recorded answers encrypted at rest (`AnswerSeal`), opened only to replay
    versions.py     the fingerprint versions (schemes, rules) receipts still hold: `Held`
    sqlite.py       the SQLite backend (`SQLiteStore`, alias `Store`)
    postgres.py     the PostgreSQL backend (`PostgresStore`), for a fleet of proxies on one store
    fleet.py        what that fleet shares besides receipts: instance leases
    dsn.py          which values name a PostgreSQL database (`is_postgres`), shown without password
    listener.py     LISTEN for receipts other processes change (PostgreSQL's NOTIFY)
    migrations.py   the schema, as recorded migrations, in each backend's dialect

`open_store(db, ...)` opens either: a `postgresql://` URL or libpq conninfo is PostgreSQL, any
other value a SQLite file. `Store` is the SQLite backend: `Store.open(path, lock_timeout=...,
clock=..., create=...)`, or `Store(conn, clock=..., path=...)` over an open sqlite3 connection.
"""

from __future__ import annotations

import os

from proxy_addon.store.base import Backend, Dialect, UniqueViolation
from proxy_addon.store.dsn import is_postgres
from proxy_addon.store.postgres import PostgresStore
from proxy_addon.store.receipts import ReceiptStore
from proxy_addon.store.records import (
    WOULD_HAVE,
    ApprovalDecision,
    Attempt,
    Clock,
    Decision,
    DecisionKind,
    Enforcement,
    Event,
    Example,
    Interim,
    Receipt,
    RecordedResponse,
    StoredAnswer,
    iso,
    new_operation_id,
    utcnow,
)
from proxy_addon.store.sqlite import SQLiteStore
from proxy_addon.store.versions import Held

Store = SQLiteStore


def open_store(
    db: str | os.PathLike[str], *, lock_timeout: float = 5.0, clock: Clock = utcnow, create: bool = True
) -> ReceiptStore:
    """The receipts store at `db`: PostgreSQL for a `postgresql://` URL or conninfo, else the SQLite file."""
    if is_postgres(db):
        return PostgresStore.open(os.fspath(db), lock_timeout=lock_timeout, clock=clock, create=create)
    return SQLiteStore.open(os.fspath(db), lock_timeout=lock_timeout, clock=clock, create=create)


__all__ = [
    "WOULD_HAVE",
    "ApprovalDecision",
    "Attempt",
    "Backend",
    "Clock",
    "Decision",
    "DecisionKind",
    "Dialect",
    "Enforcement",
    "Event",
    "Example",
    "Held",
    "Interim",
    "PostgresStore",
    "Receipt",
    "ReceiptStore",
    "RecordedResponse",
    "SQLiteStore",
    "Store",
    "StoredAnswer",
    "UniqueViolation",
    "is_postgres",
    "iso",
    "new_operation_id",
    "open_store",
    "utcnow",
]
