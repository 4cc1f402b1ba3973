"""
The SQLite schema, as sqlite-utils migrations (recorded by name in `_sqlite_migrations`).

Never edit or rename an applied migration: databases in use have recorded it by name and
will not run it again. Change the schema with a new `m00N_...` function at the end.
`SQLiteStore.open` applies what is pending inside `BEGIN IMMEDIATE`, so concurrent
openers migrate once.
"""

from __future__ import annotations

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from proxy_addon.states import UNRESOLVED

migrations = Migrations("receipt-proxy")


@migrations()
def m001_receipts(db: Database) -> None:
    db.execute(
        """
        CREATE TABLE receipts (
            operation_id TEXT PRIMARY KEY,
            api TEXT NOT NULL,
            operation TEXT NOT NULL,
            method TEXT NOT NULL,
            target TEXT NOT NULL,
            state TEXT NOT NULL,
            intent_fingerprint TEXT NOT NULL,
            intent TEXT NOT NULL,
            principal TEXT NOT NULL,
            submitted_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            completed_at TEXT,
            http_status INTEGER,
            error TEXT,
            external_id TEXT,
            flow_id TEXT,
            retry_of TEXT REFERENCES receipts(operation_id),
            instance TEXT,
            response_status INTEGER,
            response_headers TEXT,
            response_body BLOB,
            response_truncated INTEGER
        )
        """
    )
    unresolved = ", ".join(f"'{s}'" for s in sorted(UNRESOLVED))
    db.execute(
        f"CREATE UNIQUE INDEX receipts_one_unresolved_per_fingerprint "
        f"ON receipts(intent_fingerprint) WHERE state IN ({unresolved})"
    )
    db.execute("CREATE INDEX receipts_by_fingerprint ON receipts(intent_fingerprint)")
    db.execute("CREATE INDEX receipts_by_state ON receipts(state)")
    db.execute(
        """
        CREATE TABLE receipt_events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            operation_id TEXT NOT NULL REFERENCES receipts(operation_id),
            at TEXT NOT NULL,
            event TEXT NOT NULL,
            from_state TEXT,
            to_state TEXT NOT NULL,
            reason TEXT NOT NULL,
            actor TEXT NOT NULL,
            flow_id TEXT
        )
        """
    )
    db.execute("CREATE INDEX receipt_events_by_receipt ON receipt_events(operation_id, id)")
    for op in ("UPDATE", "DELETE"):
        db.execute(
            f"CREATE TRIGGER receipt_events_no_{op.lower()} BEFORE {op} ON receipt_events "
            f"BEGIN SELECT RAISE(ABORT, 'receipt_events is append-only'); END"
        )


@migrations()
def m002_prunable_events_and_idempotency_keys(db: Database) -> None:
    # Events stay append-only while their receipt exists; `prune` removes the receipt first.
    db.execute("DROP TRIGGER receipt_events_no_delete")
    db.execute(
        "CREATE TRIGGER receipt_events_no_delete BEFORE DELETE ON receipt_events "
        "WHEN EXISTS (SELECT 1 FROM receipts WHERE operation_id = OLD.operation_id) "
        "BEGIN SELECT RAISE(ABORT, 'receipt_events is append-only'); END"
    )
    db.execute("ALTER TABLE receipts ADD COLUMN idempotency_key TEXT")
    db.execute("ALTER TABLE receipts ADD COLUMN client_key TEXT")
    db.execute("CREATE INDEX receipts_by_client_key ON receipts(client_key) WHERE client_key IS NOT NULL")
    db.execute("CREATE INDEX receipt_events_by_time ON receipt_events(at)")


@migrations()
def m003_awaiting_approval_is_unresolved(db: Database) -> None:
    db.execute("DROP INDEX receipts_one_unresolved_per_fingerprint")
    unresolved = ", ".join(f"'{s}'" for s in sorted(UNRESOLVED))
    db.execute(
        f"CREATE UNIQUE INDEX receipts_one_unresolved_per_fingerprint "
        f"ON receipts(intent_fingerprint) WHERE state IN ({unresolved})"
    )


@migrations()
def m004_when_an_idempotency_key_was_first_sent(db: Database) -> None:
    # A retry reuses its predecessor's key; an API forgets a key some time after it first saw it.
    db.execute("ALTER TABLE receipts ADD COLUMN idempotency_key_at TEXT")


@migrations()
def m005_raw_target(db: Database) -> None:
    # The target as the agent sent it (redacted like `target`), when it was not the canonical
    # one that rules match and fingerprints take: `//api/./things`, `127.1`, `thing%73`.
    db.execute("ALTER TABLE receipts ADD COLUMN raw_target TEXT")


@migrations()
def m006_failed_reads(db: Database) -> None:
    # A reconcile read that fails proves nothing: the receipt stays outcome_unknown, and these
    # say how many reads failed and before when no new read is tried (Retry-After, a backoff,
    # or a settle delay). Written by `transition` as the reconcile records its verdict.
    db.execute("ALTER TABLE receipts ADD COLUMN failed_reads INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE receipts ADD COLUMN next_read_at TEXT")


@migrations()
def m007_approval_decisions(db: Database) -> None:
    # An operator's decision on a write held for approval, made from another process (`receipts
    # approve` / `receipts deny`) for the proxy that holds the write to apply. One per receipt
    # (the primary key): a receipt is decided once. Bound to the intent fingerprint the operator
    # decided on; `consumed_at` is set in the transaction that moves the receipt on. Portable
    # SQL: the same statement creates it in PostgreSQL.
    db.execute(
        """
        CREATE TABLE approval_decisions (
            operation_id TEXT PRIMARY KEY REFERENCES receipts(operation_id),
            intent_fingerprint TEXT NOT NULL,
            decision TEXT NOT NULL CHECK (decision IN ('approved', 'denied')),
            note TEXT NOT NULL,
            actor TEXT NOT NULL,
            decided_at TEXT NOT NULL,
            consumed_at TEXT
        )
        """
    )
