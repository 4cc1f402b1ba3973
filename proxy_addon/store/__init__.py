"""
The receipts store: every SQL statement and every state change of receipt-proxy.

    store = Store.open("receipts.db")
    decision = store.begin_attempt(attempt)      # committed before it returns
    if decision.kind == "forward":
        ...send once...
        store.transition(decision.receipt.operation_id, State.SUCCEEDED, reason="HTTP 201")

    records.py      the values: Attempt, Receipt, RecordedResponse, Event, Decision, ApprovalDecision; time helpers
    base.py         what a backend must guarantee, and the primitives it implements
    reads.py        the reads, written once over those primitives
    receipts.py     deciding attempts, guarded transitions, resolve, reconcile claims, prune, recovery
    sqlite.py       the SQLite backend (`SQLiteStore`, alias `Store`)
    migrations.py   the SQLite schema, as recorded migrations

`Store` is the SQLite backend: `Store.open(path, lock_timeout=..., clock=..., create=...)`,
or `Store(conn, clock=..., path=...)` over an open sqlite3 connection.
"""

from __future__ import annotations

from proxy_addon.store.base import Backend, Dialect, UniqueViolation
from proxy_addon.store.receipts import ReceiptStore
from proxy_addon.store.records import (
    ApprovalDecision,
    Attempt,
    Clock,
    Decision,
    DecisionKind,
    Event,
    Receipt,
    RecordedResponse,
    iso,
    new_operation_id,
    utcnow,
)
from proxy_addon.store.sqlite import SQLiteStore

Store = SQLiteStore

__all__ = [
    "ApprovalDecision",
    "Attempt",
    "Backend",
    "Clock",
    "Decision",
    "DecisionKind",
    "Dialect",
    "Event",
    "Receipt",
    "ReceiptStore",
    "RecordedResponse",
    "SQLiteStore",
    "Store",
    "UniqueViolation",
    "iso",
    "new_operation_id",
    "utcnow",
]
