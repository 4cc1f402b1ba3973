"""
An answer recorded for replay may carry a secret the write minted (an API key created, a token
issued). It is sealed at rest (store/sealing.py: AES-256-GCM under a key derived from
secret.key, bound to its receipt): a sealed answer opens in no other receipt and under no other
key, a store without a key records no answer, a plaintext row from an earlier version replays as
recorded, and a rule's `record` is a boolean. Through a real proxy (the minted secret never in
clear, `record: false`, an upgrade and a downgrade): tests/e2e/proxy/test_sealed_answers.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from proxy_addon.errors import RulesError, StoreError
from proxy_addon.explain.duplicates import duplicates
from proxy_addon.rules import load_rules
from proxy_addon.states import State
from proxy_addon.store import Attempt, RecordedResponse, Store, StoredAnswer
from proxy_addon.store.sealing import AnswerSeal
from proxy_addon.store.transitions import ReceiptTransitions
from tests.upstream import MINTED_KEY, MINTED_TOKEN


def db_files(db: Path) -> list[Path]:
    return [db, Path(f"{db}-wal"), Path(f"{db}-shm")]


ANSWER = RecordedResponse(
    201,
    [("Content-Type", "application/json"), ("X-Api-Token", MINTED_TOKEN)],
    json.dumps({"id": 1, "api_key": MINTED_KEY}).encode(),
)


def succeeded(store: Store, fp: str) -> str:
    d = store.begin_attempt(
        Attempt(
            api="a", operation="o", method="POST", target="https://a/x", intent_fingerprint=fp, intent={}, principal="p"
        )
    )
    store.transition(d.receipt.operation_id, State.SUCCEEDED, reason="HTTP 201", http_status=201, response=ANSWER)
    return d.receipt.operation_id


def test_a_sealed_answer_does_not_open_in_another_receipt_or_with_another_key(tmp_path):
    store = Store.open(tmp_path / "receipts.db")
    try:
        a, b = succeeded(store, "fp-a"), succeeded(store, "fp-b")
        stored_a = store.get(a).response
        assert isinstance(stored_a, StoredAnswer) and MINTED_KEY.encode() not in stored_a.sealed
        assert store.answer_seal is not None
        assert store.answer_seal.open(a, stored_a) == ANSWER
        with pytest.raises(StoreError, match=f"receipt {b} does not open"):
            store.answer_seal.open(b, stored_a)  # a's answer moved into b
        with pytest.raises(StoreError, match="does not open"):
            AnswerSeal(b"another secret.key " * 4).open(a, stored_a)
        # b's row given a's sealed answer: its duplicate is blocked, never answered with a's
        store.conn.execute("UPDATE receipts SET response_body = ? WHERE operation_id = ?", (stored_a.sealed, b))
        d = store.begin_attempt(
            Attempt(
                api="a",
                operation="o",
                method="POST",
                target="https://a/x",
                intent_fingerprint="fp-b",
                intent={},
                principal="p",
            )
        )
        assert (d.kind, d.answer) == ("blocked_succeeded", None)
        assert "its recorded answer cannot be read" in store.events(b)[-1].reason
    finally:
        store.close()
    assert MINTED_KEY.encode() not in b"".join(p.read_bytes() for p in db_files(tmp_path / "receipts.db") if p.exists())


def test_a_store_without_a_key_records_no_answer(tmp_path, monkeypatch):
    monkeypatch.setattr(ReceiptTransitions, "answer_seal", None)
    store = Store.open(tmp_path / "receipts.db")
    try:
        with pytest.raises(StoreError, match="no key to encrypt it with"):
            succeeded(store, "fp-a")
    finally:
        store.close()


def test_a_plaintext_row_replays_as_recorded(tmp_path):
    """A row with no response_encryption: recorded in clear by an earlier version, replayed as it is."""
    store = Store.open(tmp_path / "receipts.db")
    try:
        op = succeeded(store, "fp-a")
        clear = RecordedResponse(201, [("Content-Type", "application/json"), ("X-Custom", "a")], b'{"id": 1}')
        store.conn.execute(  # as an earlier version wrote it (no marker secret: this row is in clear)
            "UPDATE receipts SET response_status = 201, response_headers = ?, response_body = ?, "
            "response_encryption = NULL WHERE operation_id = ?",
            (json.dumps(clear.headers), clear.body, op),
        )
        d = store.begin_attempt(
            Attempt(
                api="a",
                operation="o",
                method="POST",
                target="https://a/x",
                intent_fingerprint="fp-a",
                intent={},
                principal="p",
            )
        )
        assert (d.kind, d.answer) == ("replay", clear)
        assert d.receipt.response is not None
        assert d.receipt.response.clear == clear and d.receipt.response.encryption is None
    finally:
        store.close()


def test_the_answer_key_is_derived_for_its_purpose_alone():
    """Not the key of the principals' HMAC: the same secret.key gives answers a key of their own (HKDF, its label)."""
    secret = b"f" * 64
    sealed = AnswerSeal(secret).columns("r1", ANSWER)["response_body"]
    assert AnswerSeal(secret).open("r1", StoredAnswer(201, False, len(sealed), "v1", sealed=sealed)) == ANSWER
    with pytest.raises(InvalidTag):
        AESGCM(secret[:32]).decrypt(sealed[:12], sealed[12:], b"r1\n201\n0")


def test_record_is_true_unless_the_rule_says_false_and_must_be_a_boolean():
    head = "api: demo\nhosts: [api.demo.test]\noperations:\n  keys.create:\n    match: {method: POST, path: /keys}\n"
    assert load_rules(head, "api.yaml").operations[0].record is True
    assert load_rules(head + "    record: false\n", "api.yaml").operations[0].record is False
    with pytest.raises(RulesError, match=r"api\.yaml:6: operations\.keys\.create\.record: expected true or false"):
        load_rules(head + "    record: never\n", "api.yaml")
    # `receipts rules explain` says what a duplicate of the success gets
    kept, unkept = (load_rules(head + extra, "api.yaml").operations[0] for extra in ("", "    record: false\n"))
    assert "after it succeeded: answered with the recorded response" in "\n".join(duplicates(kept))
    assert "after it succeeded: blocked with 409 duplicate_succeeded (record: false" in "\n".join(duplicates(unkept))
