"""
Shadow mode (`--set receipts_mode=observe`), through a real mitmdump in front of a real upstream, on
SQLite and on PostgreSQL: nothing is blocked, replayed, held or denied, every write reaches the
upstream, and the receipts' events say what enforcement would have done; `receipts report` (the
installed CLI, another process) counts it. The same duplicates in enforce mode (the default) are
still blocked or replayed. The store's side: tests/store/test_attempts.py (observe mode).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from proxy_addon.store import open_store
from tests.conftest import ROOT, TEST_RULES, wait_for
from tests.e2e.processes import METRICS_URL, Clients, Proxy
from tests.mitm.test_metrics_server import by, scrape

RECEIPTS = ROOT / ".venv" / "bin" / "receipts"

SHADOW_RULES = """
api: shadow-api
hosts: [127.0.0.1]
operations:
  mails.create:
    match: {method: POST, path: "/api/{bucket}/mails"}
    fingerprint: {body: [to]}
    decisions:
      - deny: {to: {not_ends_with: "@example.com"}}
        reason: mail leaves the company
"""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def db(request, tmp_path) -> str:
    """The receipts database of this test's proxy: a SQLite file, or a schema of its own on PostgreSQL."""
    if request.param == "postgres":
        return request.getfixturevalue("pg_cluster").new_schema()
    return str(tmp_path / "receipts.db")


def rules_dir(tmp_path: Path) -> Path:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "test-api.yaml").write_bytes((TEST_RULES / "test-api.yaml").read_bytes())
    (rules / "shadow-api.yaml").write_text(SHADOW_RULES)
    return rules


def start(tmp_path: Path, confdir: Path, db: str, *extra: str) -> Proxy:
    return Proxy(
        tmp_path,
        confdir,
        db=db,
        rules=rules_dir(tmp_path),
        extra=("--set", f"receipts_secret={tmp_path / 'secret.key'}", *extra),
    ).start()


def receipts_of(db: str, bucket: str) -> list:
    store = open_store(db, create=False)
    try:
        return sorted((r for r in store.list(limit=None) if bucket in r.target), key=lambda r: r.submitted_at)
    finally:
        store.close()


def events_of(db: str, operation_id: str) -> list:
    store = open_store(db, create=False)
    try:
        return store.events(operation_id)
    finally:
        store.close()


def settled(db: str, bucket: str, n: int) -> list:
    """The bucket's n receipts once none is submitted (their outcomes recorded)."""

    def done():
        rs = receipts_of(db, bucket)
        return rs if len(rs) == n and all(r.state != "submitted" for r in rs) else None

    return wait_for(done, timeout=15, what=f"{n} receipts with their outcomes")


def test_observe_mode_sends_every_write_and_records_what_enforcement_would_have_done(
    tmp_path, confdir, upstream, bucket, db
):
    proxy = start(tmp_path, confdir, db, "--set", "receipts_mode=observe", "--set", "receipts_metrics=127.0.0.1:0")
    clients = Clients(proxy)
    plain, things, mails = f"/api/{bucket}/plain", f"/api/{bucket}/things", f"/api/{bucket}/mails"
    send = lambda path, body: clients.send("requests", "POST", upstream.url + path, body)  # noqa: E731
    try:
        assert "receipts_mode=observe (shadow mode)" in proxy.log()
        assert "receipt-proxy: ready (recording) in observe mode" in proxy.log()
        # A write whose outcome is unknown (the upstream commits, then drops the connection), and its retry.
        upstream.plan(plain, "drop")
        assert send(plain, {"title": "p"}).status == 502
        retry = send(plain, {"title": "p"})
        assert retry.status == 201  # the upstream's own answer: sent, not blocked
        assert upstream.seen(plain) == 2
        first, second = settled(db, f"{bucket}/plain", 2)
        assert (first.state, second.state, second.shadow_of) == ("outcome_unknown", "succeeded", first.operation_id)
        assert retry.headers["x-receipt-id"] == second.operation_id
        (would,) = [e for e in events_of(db, second.operation_id) if e.event == "would_block"]
        assert would.reason.startswith(
            f"would have blocked: duplicate of receipt {first.operation_id} (outcome_unknown)"
        )
        assert [e.event for e in events_of(db, first.operation_id)][-1] == "duplicate_sent"

        # A duplicate of a success: sent again, not replayed.
        assert send(things, {"title": "t"}).status == 201
        again = send(things, {"title": "t"})
        assert (again.status, again.headers.get("x-receipt-replayed")) == (201, None)
        assert upstream.seen(things) == 2
        ok, dup = settled(db, f"{bucket}/things", 2)
        (would,) = [e for e in events_of(db, dup.operation_id) if e.event == "would_replay"]
        assert would.reason.startswith(f"would have replayed receipt {ok.operation_id}'s recorded answer")

        # A write a `deny` decision refuses in enforce mode: sent.
        mail = send(mails, {"to": "someone@elsewhere.test"})
        assert mail.status == 201 and upstream.seen(mails) == 1
        (sent,) = settled(db, f"{bucket}/mails", 1)
        (would,) = [e for e in events_of(db, sent.operation_id) if e.event == "would_deny"]
        assert "would have denied by policy decisions[0]" in would.reason and "mail leaves the company" in would.reason

        # A write of an operation with `approve: true`: not held, sent at once.
        refunds = f"/api/{bucket}/refunds"
        assert send(refunds, {"amount": 5}).status == 201 and upstream.seen(refunds) == 1
        (refund,) = settled(db, f"{bucket}/refunds", 1)
        assert "would_hold" in [e.event for e in events_of(db, refund.operation_id)]

        # What enforcement would have done, from another process: `receipts report`.
        out = subprocess.run(
            [str(RECEIPTS), "--db", db, "report", "--since", "1h", "--json"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        rows = {r["operation"]: r for r in json.loads(out)["operations"]}
        assert rows["plain.create"]["blocked"]["would_have"] == 1
        assert rows["plain.create"]["blocked"]["would_have_examples"][0]["operation_id"] == second.operation_id
        assert rows["things.create"]["replayed"]["would_have"] == 1
        assert rows["mails.create"]["denied"]["would_have"] == 1
        assert rows["refunds.create"]["held"]["would_have"] == 1
        assert all(r[c]["done"] == 0 for r in rows.values() for c in ("blocked", "replayed", "held", "denied"))
        text = subprocess.run(
            [str(RECEIPTS), "--db", db, "report", "--since", "1h"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        assert "write(s) below were SENT although enforcement would have" in text and second.operation_id in text

        url = wait_for(lambda: METRICS_URL.search(proxy.log()), what="the metrics URL").group(1)
        _, samples = scrape(url)
        assert by(samples, "receipt_proxy_mode", "mode") == {("observe",): 1.0}
        would_have = by(samples, "receipt_proxy_would_have_total", "operation", "would")
        assert would_have == {
            ("plain.create", "would_block"): 1.0,
            ("things.create", "would_replay"): 1.0,
            ("mails.create", "would_deny"): 1.0,
            ("refunds.create", "would_hold"): 1.0,
        }
    finally:
        proxy.stop()


def test_enforce_mode_still_blocks_replays_and_denies_the_same_writes(tmp_path, confdir, upstream, bucket, db):
    proxy = start(tmp_path, confdir, db)
    clients = Clients(proxy)
    plain, things, mails = f"/api/{bucket}/plain", f"/api/{bucket}/things", f"/api/{bucket}/mails"
    send = lambda path, body: clients.send("requests", "POST", upstream.url + path, body)  # noqa: E731
    try:
        upstream.plan(plain, "drop")
        assert send(plain, {"title": "p"}).status == 502
        retry = send(plain, {"title": "p"})
        assert (retry.status, retry.json()["error"]) == (409, "duplicate_unresolved")
        assert upstream.seen(plain) == 1
        assert send(things, {"title": "t"}).status == 201
        again = send(things, {"title": "t"})
        assert (again.status, again.headers.get("x-receipt-replayed")) == (201, "true")
        assert upstream.seen(things) == 1
        assert send(mails, {"to": "someone@elsewhere.test"}).status == 403
        assert upstream.seen(mails) == 0
        out = subprocess.run(
            [str(RECEIPTS), "--db", db, "report", "--since", "1h", "--json"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        rows = {r["operation"]: r for r in json.loads(out)["operations"]}
        assert (rows["plain.create"]["blocked"]["done"], rows["plain.create"]["blocked"]["would_have"]) == (1, 0)
        assert rows["things.create"]["replayed"]["done"] == 1
        assert rows["mails.create"]["denied"]["done"] == 1
    finally:
        proxy.stop()
