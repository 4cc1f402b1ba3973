"""
`receipts verify`: an untouched history is intact; each tampering an attacker with the database
can do (the append-only triggers dropped first) makes it fail, naming the first bad record and why.
Both backends: a SQLite file and PostgreSQL (tests/conftest.py `backend_db`).
"""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from proxy_addon.cli import main
from proxy_addon.proof.checkpoint_notes import sign_checkpoint
from proxy_addon.proof.signing_key import verifier_key
from proxy_addon.states import State
from proxy_addon.store import ReceiptStore, SQLiteStore, open_store
from tests.cli.conftest import attempt
from tests.conftest import FakeClock


def verify(db: str, capsys) -> tuple[int, str]:
    code = main(["verify", "--db", db])
    out = capsys.readouterr()
    return code, (out.out + out.err).strip()


def history(store: ReceiptStore, n: int = 3, start: int = 0) -> list[str]:
    """n receipts, each new -> submitted -> succeeded, one blocked duplicate each: 3n events."""
    ids = []
    for i in range(start, start + n):
        a = attempt(i)
        r = store.begin_attempt(a).receipt
        store.transition(r.operation_id, State.OUTCOME_UNKNOWN, reason="timed out")
        store.begin_attempt(a)  # a duplicate, blocked: its event
        ids.append(r.operation_id)
    return ids


def attack(store: ReceiptStore, *statements: str) -> None:
    """What someone with the database file can do: drop the triggers, then write what they like."""
    pg = not isinstance(store, SQLiteStore)
    drops = [
        f"DROP TRIGGER IF EXISTS {t}{' ON receipt_events' if pg else ''}"
        for t in ("receipt_events_no_update", "receipt_events_no_delete", "receipt_events_chained")
    ]
    for sql in (*drops, *statements):
        store._execute(sql)


@pytest.fixture
def db(backend_db):
    s = open_store(backend_db, clock=FakeClock())
    s.ids = history(s)  # type: ignore[attr-defined]
    yield backend_db, s
    s.close()


def test_an_untouched_history_is_intact(db, capsys):
    path, store = db
    code, line = verify(path, capsys)
    assert (code, line) == (0, "intact: 9 events, no signed checkpoint yet")
    rows = store._rows("SELECT id, chain_seq, prev_hash, hash FROM receipt_events ORDER BY chain_seq")
    assert [r["chain_seq"] for r in rows] == list(range(2, 11))  # position 1: where the chain starts
    assert all(a["hash"] == b["prev_hash"] for a, b in itertools.pairwise(rows))


def test_an_events_field_edited(db, capsys):
    path, store = db
    attack(store, "UPDATE receipt_events SET reason = 'all good' WHERE chain_seq = 4")
    code, line = verify(path, capsys)
    assert code == 1
    assert "(position 4)" in line and "its fields do not match its hash (edited)" in line, line


def test_an_event_deleted(db, capsys):
    path, store = db
    attack(store, "DELETE FROM receipt_events WHERE chain_seq = 5")
    code, line = verify(path, capsys)
    assert code == 1
    assert "(position 6)" in line and "position 5 is missing (deleted)" in line, line


def test_two_events_swapped(db, capsys):
    path, store = db
    attack(
        store,
        "UPDATE receipt_events SET chain_seq = -1 WHERE chain_seq = 6",
        "UPDATE receipt_events SET chain_seq = 6 WHERE chain_seq = 7",
        "UPDATE receipt_events SET chain_seq = 7 WHERE chain_seq = -1",
    )
    code, line = verify(path, capsys)
    assert code == 1
    assert "(position 6)" in line and "prev_hash is not the hash of position 5" in line, line


def test_a_receipts_state_edited_without_an_event(db, capsys):
    path, store = db
    victim = store.ids[1]
    store._execute("UPDATE receipts SET state = 'succeeded' WHERE operation_id = ?", (victim,))
    code, line = verify(path, capsys)
    assert code == 1
    assert f"receipt {victim} is succeeded, but its last transition" in line, line
    assert "to outcome_unknown: its state was edited without an event" in line


def test_an_event_written_around_the_proxy(db, capsys):
    path, store = db
    victim = store.ids[0]
    attack(store)  # PostgreSQL chains every INSERT in a trigger: dropped, as the triggers above are
    store._execute(
        "INSERT INTO receipt_events (id, operation_id, at, event, from_state, to_state, reason, actor) "
        "VALUES (1000, ?, '2026-01-01T00:00:00Z', 'transition', 'outcome_unknown', 'succeeded', 'x', 'me')",
        (victim,),
    )
    code, line = verify(path, capsys)
    assert code == 1 and "has no chain position" in line, line


def test_prune_leaves_what_verification_needs(db, capsys):
    path, store = db
    first, _kept, last = store.ids
    for gone in (first, last):
        store.resolve(gone, State.SUCCEEDED, note="it is there", actor="cli:me")
    store.clock.advance(86400 * 10)
    assert sorted(store.prune(dt.timedelta(days=1))) == sorted([first, last])
    history(store, 1)  # events after the pruned ranges
    code, line = verify(path, capsys)
    assert (code, line) == (0, "intact: 6 events, no signed checkpoint yet")
    marks = store._rows("SELECT chain_seq, through, mark FROM receipt_chain_marks ORDER BY chain_seq")
    # first: positions 2-4 and 11-12 (resolving: two events), kept: 5-7, last: 8-10 and 13-14; the prune at 15.
    assert [(m["chain_seq"], m["through"], m["mark"]) for m in marks] == [
        (1, 1, "chain_started"),
        (2, 4, "pruned"),
        (8, 14, "pruned"),
        (15, 15, "prune"),
    ]
    # A pruned range still links: its kept hash edited breaks the record after it.
    on = "" if isinstance(store, SQLiteStore) else " ON receipt_chain_marks"
    store._execute(f"DROP TRIGGER IF EXISTS receipt_chain_marks_no_update{on}")
    store._execute("UPDATE receipt_chain_marks SET hash = ? WHERE chain_seq = 2", ("0" * 64,))
    code, line = verify(path, capsys)
    assert code == 1 and "(position 5)" in line and "prev_hash is not the hash of position 4" in line, line


# --- signed checkpoints ------------------------------------------------------------------------


def signed(store: ReceiptStore, key: Ed25519PrivateKey) -> None:
    """Sign the tip now, as the proxy's signer does (gate/checkpoint_signer.py), the key recorded as the fleet's."""
    store.check_checkpoint_key(verifier_key(key))
    size, head = store.chain_tip()
    at = "2026-03-01T12:00:00.000000Z"
    assert store.record_checkpoint(size, head, at, sign_checkpoint(key, size, head, at))


def test_a_signed_history_is_intact_up_to_its_last_checkpoint(db, capsys):
    path, store = db
    signed(store, Ed25519PrivateKey.generate())
    history(store, 1, start=10)
    code, line = verify(path, capsys)
    assert (code, line) == (0, "intact: 12 events, last checkpoint at 2026-03-01T12:00:00.000000Z (position 10)")


def test_the_history_truncated_after_the_last_checkpoint(db, capsys):
    path, store = db
    signed(store, Ed25519PrivateKey.generate())  # at position 10
    history(store, 1, start=10)  # positions 11-13
    attack(  # the last receipt and the one after the checkpoint gone, with their events
        store,
        "DELETE FROM receipt_events WHERE chain_seq >= 8",
        "DELETE FROM receipts WHERE operation_id NOT IN (SELECT operation_id FROM receipt_events)",
    )
    code, line = verify(path, capsys)
    assert code == 1
    assert "the chain ends at position 7, but the checkpoint of 2026-03-01T12:00:00.000000Z signed 10" in line, line


def test_the_events_after_the_last_checkpoint_cut_off(db, capsys):
    path, store = db
    signed(store, Ed25519PrivateKey.generate())  # at position 10
    r = store.begin_attempt(attempt(50)).receipt  # 11
    store.transition(r.operation_id, State.OUTCOME_UNKNOWN, reason="timed out")  # 12
    attack(store, "DELETE FROM receipt_events WHERE chain_seq = 12")  # no checkpoint covers it: its receipt does
    code, line = verify(path, capsys)
    assert code == 1 and f"receipt {r.operation_id} is outcome_unknown, but its last transition" in line, line


def test_a_checkpoint_re_signed_with_another_key(db, capsys):
    path, store = db
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    signed(store, key)
    size, head = store.chain_tip()
    attack(store, "DELETE FROM receipt_events WHERE chain_seq = 5")  # an edit the checkpoint would show...
    forged = sign_checkpoint(other, size, head, "2026-03-01T12:00:00.000000Z")  # ...so it is signed again
    on = "" if isinstance(store, SQLiteStore) else " ON receipt_checkpoints"
    attack(store, f"DROP TRIGGER receipt_checkpoints_no_update{on}")
    store._execute("UPDATE receipt_checkpoints SET note = ?", (forged,))
    code, line = verify(path, capsys)
    assert code == 1
    assert "the checkpoint at position 10 (2026-03-01T12:00:00.000000Z): it is not signed by the key" in line, line
    # The database's own record of the key replaced too: the operator's copy of the key still tells.
    store._execute("UPDATE receipt_settings SET value = ? WHERE name = 'checkpoint_key'", (verifier_key(other),))
    assert main(["verify", "--db", path, "--public-key", verifier_key(key)]) == 1
    assert "is not signed by the key" in capsys.readouterr().out


def test_prune_keeps_every_signed_checkpoint_checkable(db, capsys):
    path, store = db
    first, _kept, last = store.ids
    signed(store, Ed25519PrivateKey.generate())  # at position 10: the last receipt's last event
    for gone in (first, last):
        store.resolve(gone, State.SUCCEEDED, note="it is there", actor="cli:me")
    store.clock.advance(86400 * 10)
    assert sorted(store.prune(dt.timedelta(days=1))) == sorted([first, last])
    marks = store._rows("SELECT chain_seq, through FROM receipt_chain_marks WHERE mark = 'pruned' ORDER BY chain_seq")
    assert [(m["chain_seq"], m["through"]) for m in marks] == [(2, 4), (8, 10), (11, 14)]  # split at 10
    code, line = verify(path, capsys)
    assert (code, line) == (0, "intact: 3 events, last checkpoint at 2026-03-01T12:00:00.000000Z (position 10)")
