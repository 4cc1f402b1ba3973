"""
The events' hash chain as the store appends it (store/hash_chain.py), on both backends: the
migration chains an existing history once and marks where the chain starts; concurrent writers
(PostgreSQL: different intents at once) keep one chain, in commit order, ids following it.
"""

from __future__ import annotations

import threading

import pytest
from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from proxy_addon.cli.verify_command import audit_store
from proxy_addon.proof.chain_links import GENESIS, record_hash
from proxy_addon.states import State
from proxy_addon.store import PostgresStore, open_store
from proxy_addon.store import migrations as schema
from tests.cli.conftest import attempt

BEFORE = [(name, fn) for name, fn in schema.ALL[: [n for n, _ in schema.ALL].index("m017_hash_chain")]]
OLD_EVENT = (
    "INSERT INTO receipt_events (operation_id, at, event, from_state, to_state, reason, actor, flow_id) "
    "VALUES (?, ?, 'transition', NULL, 'submitted', 'new attempt', 'proxy', NULL)"
)
OLD_RECEIPT = (
    "INSERT INTO receipts (operation_id, api, operation, method, target, state, intent_fingerprint, intent, "
    "principal, submitted_at, updated_at) VALUES (?, 'a', 'o', 'POST', 't', 'submitted', ?, '{}', 'p', ?, ?)"
)


def old_database(db: str, monkeypatch) -> None:
    """A database as the release before the chain left it: migrated up to m016, two receipts, two events."""
    rows = [(f"2026010{i}T000000Z-000000000{i}", f"fp-{i}", f"2026-01-0{i}T00:00:00.000000Z") for i in (1, 2)]
    if isinstance(db, str) and db.startswith("postgresql"):
        monkeypatch.setattr(schema, "ALL", BEFORE)
        old = PostgresStore.open(db)
        monkeypatch.undo()
        for r in rows:
            old._execute(OLD_RECEIPT, (r[0], r[1], r[2], r[2]))
            old._execute(OLD_EVENT, (r[0], r[2]))
        old.close()
        return
    earlier = Migrations(schema.MIGRATION_SET)
    for name, fn in BEFORE:
        earlier(name=name)(lambda d, fn=fn: fn(schema.Schema(d, postgres=False)))
    sqlite = Database(db)
    earlier.apply(sqlite)
    for r in rows:
        sqlite.execute(OLD_RECEIPT, (r[0], r[1], r[2], r[2]))
        sqlite.execute(OLD_EVENT, (r[0], r[2]))
    sqlite.conn.commit()
    sqlite.close()


def test_the_migration_chains_the_history_once_and_marks_where_the_chain_starts(backend_db, monkeypatch):
    old_database(backend_db, monkeypatch)
    store = open_store(backend_db)
    try:
        events = store._rows("SELECT * FROM receipt_events ORDER BY id")
        assert [e["chain_seq"] for e in events] == [1, 2]
        assert events[0]["prev_hash"] == GENESIS and events[1]["prev_hash"] == events[0]["hash"]
        assert all(record_hash(e) == e["hash"] for e in events)
        (mark,) = store._rows("SELECT * FROM receipt_chain_marks")
        assert (mark["chain_seq"], mark["mark"], mark["prev_hash"]) == (3, "chain_started", events[1]["hash"])
        assert "the 2 events before were chained by migration m017" in mark["detail"]
        with pytest.raises(Exception, match="append-only"):  # the trigger lifted for the migration is back
            store._execute("UPDATE receipt_events SET reason = 'x' WHERE id = 1")
        r = store.begin_attempt(attempt(7)).receipt
        assert store._rows("SELECT chain_seq FROM receipt_events WHERE operation_id = ?", (r.operation_id,)) == [
            {"chain_seq": 4}
        ]
        assert audit_store(store).line() == "intact: 3 events, no signed checkpoint yet"
    finally:
        store.close()


def test_concurrent_writers_keep_one_chain(backend_db):
    """Eight threads, each its own store and intents: one gap-free chain, in commit order, ids in its order."""
    open_store(backend_db).close()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        s = open_store(backend_db)
        try:
            for i in range(15):
                r = s.begin_attempt(attempt(n * 100 + i)).receipt
                s.record_outcome(r.operation_id, State.SUCCEEDED, reason="HTTP 201", http_status=201)
        except BaseException as e:
            errors.append(e)
        finally:
            s.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    store = open_store(backend_db)
    try:
        assert audit_store(store).line() == "intact: 240 events, no signed checkpoint yet"
        rows = store._rows("SELECT id FROM receipt_events ORDER BY chain_seq")
        assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    finally:
        store.close()
