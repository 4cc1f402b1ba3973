"""
An answer recorded for replay may carry a secret the write minted (an API key created, a token
issued). Through a real proxy: it is sealed at rest (store/sealing.py: AES-256-GCM under a key
derived from secret.key, bound to its receipt) and opened only to replay; `receipts show`,
`list --json` and `export` print its status and size only. A rule's `record: false` keeps no answer
at all, and a duplicate of the success is blocked, never replayed. Answers recorded in clear by an
earlier version still replay, and after a downgrade a sealed answer is never replayed as it is.
The sealing itself: tests/store/test_sealing.py.
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

from proxy_addon.states import State
from proxy_addon.store import Store
from tests.conftest import ROOT, TEST_RULES, marker_secrets_in
from tests.e2e.processes import ADDON, Clients, Proxy
from tests.store.test_sealing import db_files
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


def receipts_cli(db: Path, *argv: str) -> str:
    """The `receipts` CLI in its own process, as an operator runs it; its output."""
    env = {**os.environ, "HOME": str(db.parent)}
    env.pop("RECEIPT_PROXY_DB", None)
    p = subprocess.run(
        [sys.executable, "-m", "proxy_addon.cli", "--db", str(db), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_a_minted_secret_is_never_stored_in_clear_and_the_duplicate_gets_the_exact_replay(
    tmp_path, confdir, upstream, bucket
):
    proxy = Proxy(tmp_path, confdir).start()
    assert isinstance(proxy.db, Path)  # a SQLite file
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
        for argv in (
            ("show", operation_id),
            ("show", operation_id, "--json"),
            ("list", "--json"),
            ("list",),
            ("export",),
        ):
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
    assert isinstance(proxy.db, Path)  # a SQLite file
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
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "proxy_addon"], capture_output=True, timeout=60
    )
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

    from tests.e2e.processes import Answer

    r = requests.post(
        url,
        json=body,
        headers={"Authorization": "Bearer sealed-answers-caller"},
        timeout=10,
        proxies={"http": proxy.url, "https": proxy.url},
    )
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
