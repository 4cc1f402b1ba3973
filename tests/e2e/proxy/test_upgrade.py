"""
An upgrade never turns a retry into a new write (fingerprint schemes: earlier_fingerprints.py).

The addon of an earlier commit, dc97d6d (before canonical targets, decoded and NFC bodies,
hashed objects and canonical credentials: fingerprint scheme 1), runs as a real mitmdump on a
state directory and records writes; then today's addon runs on the same directory. A write
left `outcome_unknown` before the upgrade blocks its retry after it, and a success recorded
before it is replayed after it, for each request whose fingerprint the schemes read
differently: `Authorization: Bearer`, a JSON body sent as a form (`curl -d`), NFD text, an
object field, a missing field, a %-encoded path. The upstream counts one write for each.

tests/earlier/proxy_addon-dc97d6d.tar.gz is that commit's package, made with
`git archive --format=tar.gz dc97d6d proxy_addon` (kept in the repository, so a shallow clone
runs this test too).
"""

from __future__ import annotations

import http.client
import json
import tarfile
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from proxy_addon.store import Store
from tests.conftest import ROOT
from tests.e2e.processes import Proxy

HERE = ROOT / "tests"
EARLIER = HERE / "earlier" / "proxy_addon-dc97d6d.tar.gz"

RULES = """\
api: upgrade-api
hosts: [127.0.0.1]
operations:
  things.create:
    description: "No reconcile, so an unknown outcome blocks its retries until it is resolved"
    match: {method: POST, path: "/api/{bucket}/things"}
    fingerprint: {body: [title, meta]}
    external_id: id
  items.create:
    match: {method: POST, path: "/api/{bucket}/items/{name}"}
    fingerprint: {path: [name], body: [title]}
    external_id: id
"""

BEARER = {"Authorization": "Bearer upgrade-caller-1"}
NFD = unicodedata.normalize("NFD", "café crème")

# (case, path under /api/{bucket}, headers, body): each is fingerprinted differently by scheme 1 and today.
CASES: list[tuple[str, str, dict[str, str], dict[str, Any]]] = [
    ("bearer", "/things", {**BEARER, "Content-Type": "application/json"}, {"title": "bearer"}),
    ("curl -d", "/things", {**BEARER, "Content-Type": "application/x-www-form-urlencoded"}, {"title": "form"}),
    ("nfd", "/things", {**BEARER, "Content-Type": "application/json"}, {"title": NFD}),
    ("object field", "/things", {**BEARER, "Content-Type": "application/json"}, {"title": "o", "meta": {"a": [1]}}),
    ("missing field", "/things", {**BEARER, "Content-Type": "application/json"}, {"meta": "no title"}),
    ("encoded path", "/items/%74hing", {**BEARER, "Content-Type": "application/json"}, {"title": "path"}),
]


class EarlierProxy(Proxy):
    """A mitmdump running the addon of an earlier commit, unpacked into `package`."""

    def __init__(self, workdir: Path, confdir: Path, package: Path, **kwargs):
        super().__init__(workdir, confdir, **kwargs)
        self.package = package

    def args(self) -> list[str]:
        args = super().args()
        args[args.index("-s") + 1] = str(self.package / "proxy_addon" / "addon.py")  # inserts its own parent first
        return args


@pytest.fixture
def earlier_addon(tmp_path) -> Path:
    where = tmp_path / "dc97d6d"
    where.mkdir()
    with tarfile.open(EARLIER) as t:
        t.extractall(where, filter="data")
    return where


@pytest.fixture
def rules(tmp_path) -> Path:
    d = tmp_path / "rules"
    d.mkdir()
    (d / "upgrade.yaml").write_text(RULES)
    return d


def send(proxy: Proxy, url: str, headers: dict[str, str], body: dict) -> tuple[int, dict[str, str], bytes]:
    """POST through the proxy with http.client: the path goes out as written (%74 stays %74)."""
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=20)
    try:
        conn.request("POST", url, body=json.dumps(body, ensure_ascii=False).encode(), headers=headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    except (OSError, http.client.HTTPException):
        return 0, {}, b""
    finally:
        conn.close()


def receipts(db: Path, bucket: str):
    store = Store.open(db, create=False)
    try:
        found = [r for r in store.list(limit=None) if bucket in r.target]
        return {r.operation_id: (r, [e.event for e in store.events(r.operation_id)]) for r in found}
    finally:
        store.close()


@pytest.mark.parametrize("outcome", ["outcome_unknown", "succeeded"])
def test_a_retry_after_an_upgrade_is_still_a_retry(outcome, tmp_path, confdir, upstream, bucket, earlier_addon, rules):
    db = tmp_path / "state" / "receipts.db"
    db.parent.mkdir()
    base = f"{upstream.url}/api/{bucket}"
    before = EarlierProxy(tmp_path, confdir, earlier_addon, db=db, rules=rules).start()
    try:
        for _, path, headers, body in CASES:
            if outcome == "outcome_unknown":
                upstream.plan(f"/api/{bucket}{path}", "drop")  # committed, then the connection dropped
            status, h, _ = send(before, base + path, headers, body)
            assert h.get("x-receipt-state") == outcome, (path, status, h)
    finally:
        before.stop()
    first = receipts(db, bucket)
    assert len(first) == len(CASES)
    writes = len([r for r in upstream.requests if bucket in r["path"]])
    assert writes == len(CASES)

    after = Proxy(tmp_path, confdir, db=db, rules=rules).start()
    try:
        for case, path, headers, body in CASES:
            status, h, answer = send(after, base + path, headers, body)
            if outcome == "outcome_unknown":
                assert status == 409, (case, status, answer)
                assert json.loads(answer)["error"] == "duplicate_unresolved", case
            else:
                assert (status, h.get("x-receipt-replayed")) == (201, "true"), (case, status, h, answer)
            assert h["x-receipt-id"] in first, case  # answered from the receipt made before the upgrade
    finally:
        after.stop()
    assert len([r for r in upstream.requests if bucket in r["path"]]) == writes  # not one write more
    last = receipts(db, bucket)
    assert set(last) == set(first)  # no new receipt
    for receipt, events in last.values():
        assert receipt.state == outcome
        assert events.count("replayed" if outcome == "succeeded" else "blocked") == 1
        assert receipt.fingerprint_scheme is None  # made before schemes were recorded


def test_a_new_write_after_the_upgrade_is_recorded_under_todays_scheme(tmp_path, confdir, upstream, bucket, rules):
    db = tmp_path / "receipts.db"
    proxy = Proxy(tmp_path, confdir, db=db, rules=rules).start()
    try:
        status, _, _ = send(proxy, f"{upstream.url}/api/{bucket}/things", BEARER, {"title": "new"})
        assert status == 201
    finally:
        proxy.stop()
    ((receipt, _),) = receipts(db, bucket).values()
    from proxy_addon.intent.fingerprint import SCHEME
    from proxy_addon.rules import load_rules_path

    op = load_rules_path(rules).operation("upgrade-api", "things.create")
    assert op is not None
    assert (receipt.fingerprint_scheme, receipt.fingerprint_rule) == (SCHEME, op.rule_digest)


def test_an_edited_rule_keeps_blocking_the_retries_of_its_unresolved_writes(tmp_path, confdir, upstream, bucket, rules):
    """
    The rule's fingerprint is edited while a write is unresolved: the reload names it in a
    WARNING, and the retry (fingerprinted otherwise by the new rule) is still blocked. Once the
    write is resolved, the new rule decides: a success under the old one is not replayed.
    """
    db = tmp_path / "receipts.db"
    path = f"/api/{bucket}/things"
    proxy = Proxy(tmp_path, confdir, db=db, rules=rules).start()
    try:
        upstream.plan(path, "drop")
        _, h, _ = send(proxy, upstream.url + path, BEARER, {"title": "edited", "meta": "m1"})
        assert h["x-receipt-state"] == "outcome_unknown"
        unknown = h["x-receipt-id"]
        (rules / "upgrade.yaml").write_text(RULES.replace("body: [title, meta]", "body: [title]"))
        from tests.conftest import wait_for

        wait_for(lambda: "rules reloaded" in proxy.log(), timeout=30, what="the edited rules to load")
        warning = next(line for line in proxy.log().splitlines() if "earlier version of its rule" in line)
        assert f"upgrade-api things.create: 1 unresolved receipt (newest {unknown})" in warning
        status, h, answer = send(proxy, upstream.url + path, BEARER, {"title": "edited", "meta": "m1"})
        assert (status, h.get("x-receipt-id")) == (409, unknown), answer
        assert upstream.seen(path) == 1
    finally:
        proxy.stop()
    store = Store.open(db, create=False)
    try:
        assert [e.event for e in store.events(unknown)].count("blocked") == 1
    finally:
        store.close()
