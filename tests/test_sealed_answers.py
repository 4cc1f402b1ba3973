"""
An answer recorded for replay may carry a secret the write minted (an API key created, a token
issued). It is sealed at rest (store/sealing.py: AES-256-GCM under a key derived from
secret.key, bound to its receipt) and opened only to replay; `receipts show`, `list --json` and
`export` print its status and size only. A rule's `record: false` keeps no answer at all, and
a duplicate of the success is blocked, never replayed. Answers recorded in clear by an earlier
version still replay.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
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
from tests.conftest import ADDON, ROOT, TEST_RULES, Clients, Proxy, marker_secrets_in
from tests.upstream import MINTED_KEY, MINTED_TOKEN

# An API whose key creation keeps no answer (the key is shown once), beside one that keeps it sealed.
KEYS_RULES = """\
api: keys
hosts: [127.0.0.1]
credentials: {header: api-key}
operations:
  keys.create:
    match: {method: POST, path: "/keys/{bucket}"}
    fingerprint: {body: [title]}
    external_id: id
    record: false
"""


def db_files(db: Path) -> list[Path]:
    return [db, Path(f"{db}-wal"), Path(f"{db}-shm")]


def receipts_cli(db: Path, *argv: str) -> str:
    """The `receipts` CLI in its own process, as an operator runs it; its output."""
    env = {**os.environ, "HOME": str(db.parent)}
    env.pop("RECEIPT_PROXY_DB", None)
    p = subprocess.run([sys.executable, "-m", "proxy_addon.cli", "--db", str(db), *argv],
                       capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_a_minted_secret_is_never_stored_in_clear_and_the_duplicate_gets_the_exact_replay(
    tmp_path, confdir, upstream, bucket
):
    proxy = Proxy(tmp_path, confdir).start()
    path = f"/api/{bucket}/plain"
    clients = Clients(proxy)
    try:
        upstream.plan(path, "mint")
        first = clients.send("requests", "POST", f"{upstream.url}{path}", {"title": "a new key"})
        assert first.status == 201 and MINTED_KEY.encode() in first.body
        assert first.headers["x-api-token"] == MINTED_TOKEN
        again = clients.send("requests", "POST", f"{upstream.url}{path}", {"title": "a new key"})
        assert again.headers.get("x-receipt-replayed") == "true"
        assert (again.status, again.body) == (201, first.body)  # the exact answer, key and all
        assert again.headers["x-api-token"] == MINTED_TOKEN
        assert upstream.seen(path) == 1
        # While it runs (the WAL holds the newest pages), no byte of the DB files holds either secret.
        assert marker_secrets_in([*db_files(proxy.db), proxy.log_path]) == []
        operation_id = first.headers["x-receipt-id"]
        shown = json.loads(receipts_cli(proxy.db, "show", operation_id, "--json"))
        assert (shown["response_status"], shown["response_encrypted"]) == (201, True)
        assert shown["response_size"] > len(first.body)
        for argv in (("show", operation_id), ("show", operation_id, "--json"), ("list", "--json"), ("list",),
                     ("export",)):
            out = receipts_cli(proxy.db, *argv)
            assert operation_id in out
            assert MINTED_KEY not in out and MINTED_TOKEN not in out, argv
    finally:
        proxy.stop()
    assert marker_secrets_in([*db_files(proxy.db), proxy.log_path]) == []


def test_record_false_keeps_no_answer_and_blocks_the_duplicate(tmp_path, confdir, upstream, bucket):
    rules = tmp_path / "rules"
    rules.mkdir()
    shutil.copy(TEST_RULES / "test-api.yaml", rules / "test-api.yaml")
    (rules / "keys.yaml").write_text(KEYS_RULES)
    proxy = Proxy(tmp_path, confdir, rules=rules).start()
    path = f"/keys/{bucket}"
    clients = Clients(proxy)
    try:
        upstream.plan(path, "mint")
        first = clients.send("requests", "POST", f"{upstream.url}{path}", {"title": "shown once"})
        assert first.status == 201 and MINTED_KEY.encode() in first.body  # the agent gets it, once
        again = clients.send("requests", "POST", f"{upstream.url}{path}", {"title": "shown once"})
        assert again.status == 409 and "x-receipt-replayed" not in again.headers
        doc = again.json()
        assert (doc["error"], doc["state"], doc["external_id"]) == ("duplicate_succeeded", "succeeded", "1")
        assert MINTED_KEY.encode() not in again.body
        assert upstream.seen(path) == 1
        assert marker_secrets_in(db_files(proxy.db)) == []
    finally:
        proxy.stop()
    store = Store.open(proxy.db, create=False)
    try:
        (receipt,) = [r for r in store.list() if bucket in r.target]
        assert (receipt.state, receipt.http_status, receipt.response) == (State.SUCCEEDED, 201, None)
        assert store.events(receipt.operation_id)[-1].reason == "duplicate blocked: succeeded, no answer recorded"
    finally:
        store.close()
    assert marker_secrets_in(db_files(proxy.db)) == []


# The last commit that recorded answers in clear and kept no check value of secret.key on SQLite.
BEFORE = "248c3c8"


def addon_of(commit: str, where: Path) -> Path:
    """The addon script of an earlier commit of this repository, unpacked under `where`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit, "proxy_addon"],
                             capture_output=True, timeout=60)
    if archive.returncode != 0:
        pytest.skip(f"no git history to take commit {commit} from: {archive.stderr.decode(errors='replace')}")
    where.mkdir()
    (where / "addon.tar").write_bytes(archive.stdout)
    with tarfile.open(where / "addon.tar") as tar:
        tar.extractall(where, filter="data")
    return where / "proxy_addon" / "addon.py"


class ProxyOf(Proxy):
    """A Proxy running another addon script (an earlier version's)."""

    def __init__(self, addon: Path, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.addon = addon

    def args(self) -> list[str]:
        return [str(self.addon) if a == str(ADDON) else a for a in super().args()]


def header_credentials_only(proxy: Proxy, url: str, body: dict):
    """A write whose only credential is a header: its fingerprint is one under schemes 2 and 3 (caller.py).
    (Clients.send adds a `?token=`, which scheme 3 counts in the principal and scheme 2 did not.)"""
    import requests

    from tests.conftest import Answer

    r = requests.post(url, json=body, headers={"Authorization": "Bearer sealed-answers-caller"}, timeout=10,
                      proxies={"http": proxy.url, "https": proxy.url})
    return Answer(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content)


def test_an_answer_recorded_in_clear_before_the_upgrade_still_replays(tmp_path, confdir, upstream, bucket):
    old = ProxyOf(addon_of(BEFORE, tmp_path / "before"), tmp_path, confdir).start()
    path = f"/api/{bucket}/plain"
    try:
        first = header_credentials_only(old, f"{upstream.url}{path}", {"title": "before the upgrade"})
        assert (first.status, first.headers.get("x-receipt-state")) == (201, "succeeded")
    finally:
        old.stop()
    new = Proxy(tmp_path, confdir).start()  # today's addon, on the same state directory
    try:
        again = header_credentials_only(new, f"{upstream.url}{path}", {"title": "before the upgrade"})
        assert again.headers.get("x-receipt-replayed") == "true"
        assert (again.status, again.body) == (201, first.body)
        assert again.headers["x-receipt-id"] == first.headers["x-receipt-id"]
        assert upstream.seen(path) == 1
    finally:
        new.stop()
    store = Store.open(new.db, create=False)
    try:
        stored = store.get(first.headers["x-receipt-id"]).response
        assert stored is not None and stored.encryption is None and stored.clear is not None  # told apart: no scheme
        assert store.recorded_key_check() is not None  # the key beside it, recorded at the first start since
    finally:
        store.close()


def test_after_a_downgrade_a_sealed_answer_is_never_replayed_as_it_is(tmp_path, confdir, upstream, bucket):
    """An earlier version finds no answer on a sealed row (no response_status): it blocks, never sends ciphertext."""
    new = Proxy(tmp_path, confdir).start()
    path = f"/api/{bucket}/plain"
    try:
        upstream.plan(path, "mint")
        first = header_credentials_only(new, f"{upstream.url}{path}", {"title": "then downgraded"})
        assert first.status == 201
    finally:
        new.stop()
    old = ProxyOf(addon_of(BEFORE, tmp_path / "before"), tmp_path, confdir).start()
    try:
        again = header_credentials_only(old, f"{upstream.url}{path}", {"title": "then downgraded"})
        assert again.status == 409 and again.json()["error"] == "duplicate_succeeded"
        assert "x-receipt-replayed" not in again.headers
        assert upstream.seen(path) == 1
    finally:
        old.stop()


# --- the store: sealing, binding, and no answer without a key -----------------------------------

ANSWER = RecordedResponse(201, [("Content-Type", "application/json"), ("X-Api-Token", MINTED_TOKEN)],
                          json.dumps({"id": 1, "api_key": MINTED_KEY}).encode())


def succeeded(store: Store, fp: str) -> str:
    d = store.begin_attempt(Attempt(api="a", operation="o", method="POST", target="https://a/x",
                                    intent_fingerprint=fp, intent={}, principal="p"))
    store.transition(d.receipt.operation_id, State.SUCCEEDED, reason="HTTP 201", http_status=201, response=ANSWER)
    return d.receipt.operation_id


def test_a_sealed_answer_does_not_open_in_another_receipt_or_with_another_key(tmp_path):
    store = Store.open(tmp_path / "receipts.db")
    try:
        a, b = succeeded(store, "fp-a"), succeeded(store, "fp-b")
        stored_a = store.get(a).response
        assert isinstance(stored_a, StoredAnswer) and MINTED_KEY.encode() not in stored_a.sealed
        assert store.answer_seal.open(a, stored_a) == ANSWER
        with pytest.raises(StoreError, match=f"receipt {b} does not open"):
            store.answer_seal.open(b, stored_a)  # a's answer moved into b
        with pytest.raises(StoreError, match="does not open"):
            AnswerSeal(b"another secret.key " * 4).open(a, stored_a)
        # b's row given a's sealed answer: its duplicate is blocked, never answered with a's
        store.conn.execute("UPDATE receipts SET response_body = ? WHERE operation_id = ?", (stored_a.sealed, b))
        d = store.begin_attempt(Attempt(api="a", operation="o", method="POST", target="https://a/x",
                                        intent_fingerprint="fp-b", intent={}, principal="p"))
        assert (d.kind, d.answer) == ("blocked_succeeded", None)
        assert "its recorded answer cannot be read" in store.events(b)[-1].reason
    finally:
        store.close()
    assert MINTED_KEY.encode() not in b"".join(p.read_bytes() for p in db_files(tmp_path / "receipts.db")
                                               if p.exists())


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
        d = store.begin_attempt(Attempt(api="a", operation="o", method="POST", target="https://a/x",
                                        intent_fingerprint="fp-a", intent={}, principal="p"))
        assert (d.kind, d.answer) == ("replay", clear)
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


# --- the rule: `record:` ----------------------------------------------------------------------

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
