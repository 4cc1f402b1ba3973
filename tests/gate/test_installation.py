"""
A receipts database keeps a check value of its secret.key (store/key_check.py), checked as an
Installation opens it (gate/installation.py): recorded once and the same key opens again, a database
with no receipt takes a new key, one from before the check records its key then refuses another,
and a missing key beside a database with receipts is refused. With a new key every principal, so
every fingerprint, would change. A proxy started with the key lost, on SQLite and on PostgreSQL:
tests/e2e/proxy/test_secret_key.py.
"""

from __future__ import annotations

import secrets
import sqlite3

import pytest

from proxy_addon.errors import StoreError
from proxy_addon.gate.installation import Installation, key_check
from proxy_addon.proof.signing_key import load_or_create_signing_key, verifier_key
from proxy_addon.store import Attempt, Store


def test_the_check_value_is_recorded_once_and_the_same_key_opens_again(tmp_path):
    db = tmp_path / "receipts.db"
    inst = Installation.open(db)
    try:
        assert (tmp_path / "secret.key").exists()  # a new database with no key: the key is made
        assert inst.store.recorded_key_check() == key_check(inst.key)
    finally:
        inst.release()
        inst.store.close()
    again = Installation.open(db)
    try:
        assert again.key == inst.key and again.store.answer_seal is not None
    finally:
        again.release()
        again.store.close()


def test_a_database_with_no_receipt_takes_a_new_key(tmp_path):
    """A database that holds nothing yet (and no check value) is as good as new: a missing key is made."""
    db = tmp_path / "receipts.db"
    Store.open(db).close()
    inst = Installation.open(db)
    try:
        assert (tmp_path / "secret.key").exists()
        assert inst.store.recorded_key_check() == key_check(inst.key)
    finally:
        inst.release()
        inst.store.close()


def test_a_database_from_before_the_check_records_its_key_then_refuses_another(tmp_path):
    """A database written before it kept a check value (no receipt_settings row) takes the key beside it."""
    db = tmp_path / "receipts.db"
    inst = Installation.open(db)
    store = inst.store
    store.begin_attempt(_attempt())
    inst.release()
    store.close()
    with sqlite3.connect(db) as conn:  # as before m011: no check value recorded
        conn.execute("DELETE FROM receipt_settings")
    inst = Installation.open(db)
    try:
        assert inst.store.recorded_key_check() == key_check(inst.key)
    finally:
        inst.release()
        inst.store.close()
    (tmp_path / "secret.key").write_text(secrets.token_hex(32) + "\n")
    with pytest.raises(StoreError, match="is not the one the receipts database"):
        Installation.open(db)


def test_a_missing_key_beside_a_database_with_receipts_is_refused_even_without_a_check_value(tmp_path):
    db = tmp_path / "receipts.db"
    store = Store.open(db)
    store.begin_attempt(_attempt())
    store.close()
    with pytest.raises(StoreError, match=r"is missing, but the receipts database .* holds receipts"):
        Installation.open(db)
    assert not (tmp_path / "secret.key").exists()


def _attempt() -> Attempt:
    return Attempt(
        api="a", operation="o", method="POST", target="https://a/x", intent_fingerprint="fp-1", intent={}, principal="p"
    )


def test_the_checkpoint_key_is_made_beside_secret_key_and_checked_like_it(backend_db, tmp_path, monkeypatch):
    """checkpoint.key: made once beside secret.key, its verifier key recorded; another or none refused after."""
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("RECEIPT_PROXY_STATE_DIR", str(state))
    secret = str(state / "secret.key")
    inst = Installation.open(backend_db, secret=secret)
    try:
        assert (state / "checkpoint.key").stat().st_mode & 0o777 == 0o600
        assert inst.signing_key is not None
        assert inst.store.recorded_checkpoint_key() == verifier_key(inst.signing_key)
    finally:
        inst.release()
        inst.store.close()
    (state / "checkpoint.key").rename(state / "kept.key")
    with pytest.raises(StoreError, match=r"checkpoint key .*checkpoint\.key is missing"):
        Installation.open(backend_db, secret=secret)
    load_or_create_signing_key(state / "checkpoint.key")  # another key
    with pytest.raises(StoreError, match=r"is not the one .* records its checkpoints signed with"):
        Installation.open(backend_db, secret=secret)
    (state / "kept.key").replace(state / "checkpoint.key")
    again = Installation.open(backend_db, secret=secret)
    again.release()
    again.store.close()
