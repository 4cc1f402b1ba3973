"""
Reconciling unknown outcomes with reads: inline in the proxy when a duplicate arrives,
and from the `receipts reconcile` CLI. The upstream counts the reads and the writes.
The reconciler's pure parts: tests/reconcile/test_http_reads.py.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

from proxy_addon.store import Receipt, Store
from tests.conftest import SECRETS, at_once, wait_for
from tests.e2e.processes import Clients, Proxy

RECEIPTS = Path(sys.executable).parent / "receipts"


def receipts_for(proxy: Proxy, bucket: str, kind: str) -> list[Receipt]:
    store = Store.open(proxy.db, create=False)
    try:
        return sorted(
            (r for r in store.list(limit=None) if f"/api/{bucket}/{kind}" in r.target), key=lambda r: r.submitted_at
        )
    finally:
        store.close()


def reasons(proxy: Proxy, operation_id: str) -> list[str]:
    store = Store.open(proxy.db, create=False)
    try:
        return [f"{e.event}:{e.from_state}->{e.to_state}:{e.reason}" for e in store.events(operation_id)]
    finally:
        store.close()


def unknown_write(clients: Clients, proxy: Proxy, upstream, bucket: str, kind: str, body: dict, fault: str) -> Receipt:
    """Send one write that the upstream breaks with `fault`; return its outcome_unknown receipt."""
    upstream.plan(f"/api/{bucket}/{kind}", fault)
    assert clients.send("requests", "POST", f"{upstream.url}/api/{bucket}/{kind}", body).status == 502
    (r,) = wait_for(
        lambda: [
            x for x in receipts_for(proxy, bucket, kind) if x.state == "outcome_unknown" and x.intent["body"] == body
        ],
        what="an outcome_unknown receipt",
    )
    return r


def test_found_by_the_read_becomes_succeeded(clients, proxy, upstream, bucket):
    r = unknown_write(clients, proxy, upstream, bucket, "things", {"title": "found"}, "drop")
    dup = clients.send("httpx", "POST", f"{upstream.url}/api/{bucket}/things", {"title": "found"})
    assert dup.status == 409
    assert (dup.json()["error"], dup.json()["external_id"]) == ("duplicate_succeeded", "1")
    (after,) = receipts_for(proxy, bucket, "things")
    assert (after.operation_id, after.state, after.external_id) == (r.operation_id, "succeeded", "1")
    assert upstream.reads(f"/api/{bucket}/things") == 1
    assert upstream.commits(f"/api/{bucket}/things") == 1
    history = reasons(proxy, r.operation_id)
    assert any("outcome_unknown->reconciling" in h for h in history)
    assert any(
        "reconciling->succeeded" in h
        and f"read GET http://127.0.0.1:{upstream.port}/api/{bucket}/things" in h
        and "found among 1 items (id=1)" in h
        for h in history
    )
    # The read carried the duplicate's own credentials; none of them is stored.
    (read,) = [q for q in upstream.requests if q["method"] == "GET" and q["path"] == f"/api/{bucket}/things"]
    assert read["headers"]["api-key"] == SECRETS["api-key"]


def test_proven_absent_becomes_safe_to_retry_and_the_duplicate_is_sent(clients, proxy, upstream, bucket):
    r = unknown_write(clients, proxy, upstream, bucket, "things", {"title": "lost"}, "lost")
    dup = clients.send("curl", "POST", f"{upstream.url}/api/{bucket}/things", {"title": "lost"})
    assert dup.status == 201
    first, second = receipts_for(proxy, bucket, "things")
    assert (first.operation_id, first.state) == (r.operation_id, "safe_to_retry")
    assert (second.state, second.retry_of) == ("succeeded", r.operation_id)
    assert upstream.commits(f"/api/{bucket}/things") == 1
    assert upstream.reads(f"/api/{bucket}/things") == 1
    assert "absence is proven" in reasons(proxy, r.operation_id)[-1]


def test_absent_but_not_provable_goes_to_manual_review(clients, proxy, upstream, bucket):
    r = unknown_write(clients, proxy, upstream, bucket, "notes", {"title": "maybe"}, "lost")
    dup = clients.send("requests", "POST", f"{upstream.url}/api/{bucket}/notes", {"title": "maybe"})
    assert dup.status == 409
    assert dup.json()["state"] == "manual_review"
    assert "resolve it" in dup.json()["hint"]
    (after,) = receipts_for(proxy, bucket, "notes")
    assert after.state == "manual_review"
    assert "does not say this read proves absence" in reasons(proxy, r.operation_id)[-2]
    assert upstream.seen(f"/api/{bucket}/notes") == 1  # the duplicate never went out


def test_a_failing_read_leaves_the_outcome_unknown(clients, proxy, upstream, bucket):
    r = unknown_write(clients, proxy, upstream, bucket, "things", {"title": "read 500"}, "drop")
    upstream.plan_read(f"/api/{bucket}/things", "500")
    dup = clients.send("requests", "POST", f"{upstream.url}/api/{bucket}/things", {"title": "read 500"})
    assert (dup.status, dup.json()["state"]) == (409, "outcome_unknown")  # a failed read proves nothing
    assert "HTTP 500: the read failed" in reasons(proxy, r.operation_id)[-2]
    assert "failed read 1 of 3: next read not before" in reasons(proxy, r.operation_id)[-2]
    assert upstream.commits(f"/api/{bucket}/things") == 1


def test_a_read_past_its_timeout_leaves_the_outcome_unknown(tmp_path, confdir, upstream, bucket):
    proxy = Proxy(tmp_path, confdir, extra=("--set", "receipts_read_timeout=1")).start()
    try:
        clients = Clients(proxy)
        r = unknown_write(clients, proxy, upstream, bucket, "things", {"title": "slow read"}, "drop")
        upstream.plan_read(f"/api/{bucket}/things", "hang")
        dup = clients.send("requests", "POST", f"{upstream.url}/api/{bucket}/things", {"title": "slow read"})
        assert (dup.status, dup.json()["state"]) == (409, "outcome_unknown")  # a failed read proves nothing
        assert "failed: ReadTimeout" in reasons(proxy, r.operation_id)[-2]
    finally:
        proxy.stop()


def test_no_reconcile_spec_leaves_the_receipt_blocked_without_a_read(clients, proxy, upstream, bucket):
    unknown_write(clients, proxy, upstream, bucket, "plain", {"title": "no spec"}, "drop")
    dup = clients.send("requests", "POST", f"{upstream.url}/api/{bucket}/plain", {"title": "no spec"})
    assert (dup.status, dup.json()["state"]) == (409, "outcome_unknown")
    assert upstream.reads(f"/api/{bucket}/plain") == 0


def test_ten_concurrent_duplicates_trigger_exactly_one_read(clients, proxy, upstream, bucket):
    unknown_write(clients, proxy, upstream, bucket, "things", {"title": "crowd"}, "drop")
    answers = at_once(
        *[lambda: Clients(proxy).send("httpx", "POST", f"{upstream.url}/api/{bucket}/things", {"title": "crowd"})] * 10
    )
    assert upstream.reads(f"/api/{bucket}/things") == 1
    assert upstream.commits(f"/api/{bucket}/things") == 1
    assert [a.status for a in answers] == [409] * 10
    assert {a.json()["error"] for a in answers} <= {"duplicate_succeeded", "duplicate_unresolved"}
    assert receipts_for(proxy, bucket, "things")[0].state == "succeeded"


def test_idempotency_key_is_injected_and_reused_without_a_read(clients, proxy, upstream, bucket):
    url = f"{upstream.url}/api/{bucket}/payments"
    r = unknown_write(clients, proxy, upstream, bucket, "payments", {"amount": 5, "customer": "c1"}, "drop")
    assert r.idempotency_key == f"receipt-{r.operation_id}"
    retry = clients.send("requests", "POST", url, {"amount": 5, "customer": "c1"})
    assert retry.status == 201
    sent = [
        q["headers"].get("Idempotency-Key")
        for q in upstream.requests
        if q["path"].startswith(f"/api/{bucket}/payments")
    ]
    assert sent == [r.idempotency_key, r.idempotency_key]  # the server deduplicates the second
    first, second = receipts_for(proxy, bucket, "payments")
    assert (first.state, second.retry_of, second.idempotency_key) == (
        "safe_to_retry",
        first.operation_id,
        r.idempotency_key,
    )
    assert "deduplicates by Idempotency-Key" in reasons(proxy, first.operation_id)[-1]
    assert upstream.reads(f"/api/{bucket}/payments") == 0


AGENT_KEY = "agent-key-K1-7f3e9a0c"  # distinctive: two bytes like "K1" turn up in any large DB by chance


def test_agent_idempotency_keys(clients, proxy, upstream, bucket):
    url = f"{upstream.url}/api/{bucket}/payments"
    ok = clients.send("requests", "POST", url, {"amount": 1, "customer": "k"}, headers={"Idempotency-Key": AGENT_KEY})
    assert ok.status == 201
    other = clients.send(
        "requests", "POST", url, {"amount": 2, "customer": "k"}, headers={"Idempotency-Key": AGENT_KEY}
    )
    assert other.status == 422
    assert other.json()["error"] == "idempotency_key_reused"
    # The receipt's key is forwarded in place of the agent's own, which is never sent nor stored in the clear.
    assert [
        q["headers"].get("Idempotency-Key")
        for q in upstream.requests
        if q["path"].startswith(f"/api/{bucket}/payments")
    ] == [ok.headers["x-receipt-idempotency-key"]]
    assert ok.headers["x-receipt-idempotency-key"] == f"receipt-{ok.headers['x-receipt-id']}"
    assert AGENT_KEY.encode() not in proxy.db.read_bytes() + Path(f"{proxy.db}-wal").read_bytes()

    # The same key while the first attempt is unresolved: 409 (plain.create has no reconcile spec).
    plain = f"{upstream.url}/api/{bucket}/plain"
    upstream.plan(f"/api/{bucket}/plain", "drop")
    assert clients.send("requests", "POST", plain, {"title": "t"}, headers={"Idempotency-Key": "K2"}).status == 502
    wait_for(lambda: [r for r in receipts_for(proxy, bucket, "plain") if r.state == "outcome_unknown"])
    again = clients.send("requests", "POST", plain, {"title": "t"}, headers={"Idempotency-Key": "K2"})
    assert (again.status, again.json()["error"]) == (409, "duplicate_unresolved")
    changed = clients.send("requests", "POST", plain, {"title": "u"}, headers={"Idempotency-Key": "K2"})
    assert changed.status == 422
    assert upstream.seen(f"/api/{bucket}/plain") == 1


def test_cli_reconcile_decides_with_a_read_the_upstream_received(clients, proxy, upstream, bucket, monkeypatch):
    found = unknown_write(clients, proxy, upstream, bucket, "things", {"title": "cli found"}, "drop")
    absent = unknown_write(clients, proxy, upstream, bucket, "things", {"title": "cli absent"}, "lost")
    for r, state in [(found, "succeeded"), (absent, "safe_to_retry")]:
        out = subprocess.run(
            [
                str(RECEIPTS),
                "--db",
                str(proxy.db),
                "reconcile",
                r.operation_id,
                "--rules",
                str(proxy.rules),
                "--header",
                f"api-key: {SECRETS['api-key']}",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        (result,) = json.loads(out.stdout)
        assert (result["operation_id"], result["state"]) == (r.operation_id, state)
    assert upstream.reads(f"/api/{bucket}/things") == 2
    assert upstream.commits(f"/api/{bucket}/things") == 1  # the first; the lost one never committed
    assert SECRETS["api-key"].encode() not in proxy.db.read_bytes() + Path(f"{proxy.db}-wal").read_bytes()


def test_before_settle_a_duplicate_reads_once_and_is_told_when_to_retry(clients, proxy, upstream, bucket):
    path = f"/api/{bucket}/messages"
    r = unknown_write(clients, proxy, upstream, bucket, "messages", {"title": "settling"}, "lost")
    dup = clients.send("httpx", "POST", upstream.url + path, {"title": "settling"})
    assert dup.status == 409
    assert dup.json()["state"] == "outcome_unknown" and dup.json()["retry_after"]
    assert 1 <= int(dup.headers["retry-after"]) <= 3
    assert upstream.reads(path) == 1  # looked once: an object found now would have proven success
    assert "proves absence only 2s after" in reasons(proxy, r.operation_id)[-2]
    again = clients.send("httpx", "POST", upstream.url + path, {"title": "settling"})
    assert again.status == 409 and upstream.reads(path) == 1  # no second read before the delay has passed
    wait_for(
        lambda: clients.send("httpx", "POST", upstream.url + path, {"title": "settling"}).status == 201,
        timeout=8,
        interval=0.5,
        what="the retry after the settle delay",
    )
    first, second = receipts_for(proxy, bucket, "messages")
    assert (first.operation_id, first.state) == (r.operation_id, "safe_to_retry")
    assert (second.state, second.retry_of) == ("succeeded", r.operation_id)
    assert upstream.commits(path) == 1 and upstream.reads(path) == 2


def test_an_already_exists_answer_is_read_at_once_and_found(clients, proxy, upstream, bucket):
    path = f"/api/{bucket}/posts"
    import httpx

    assert httpx.post(upstream.url + path, json={"title": "twice"}).status_code == 201  # made outside the proxy
    upstream.plan(path, "409")
    answer = clients.send("requests", "POST", upstream.url + path, {"title": "twice"})
    assert answer.status == 409  # the API's own answer reaches the agent...
    assert answer.headers["x-receipt-state"] == "succeeded"  # ...with what the read proved
    assert answer.headers["x-receipt-external-id"] == "1"
    (receipt,) = receipts_for(proxy, bucket, "posts")
    assert (receipt.state, receipt.external_id, receipt.http_status) == ("succeeded", "1", 409)
    history = reasons(proxy, receipt.operation_id)
    assert "submitted->outcome_unknown:upstream answered HTTP 409: the post may already exist" in history[1]
    assert "outcome_unknown->reconciling" in history[2] and "reconciling->succeeded" in history[3]
    assert upstream.commits(path) == 1 and upstream.reads(path) == 1
    dup = clients.send("requests", "POST", upstream.url + path, {"title": "twice"})
    # Never sent again, and the API's 409 is not replayed as if it were the success: the receipt's answer.
    assert (dup.status, dup.json()["error"], dup.json()["external_id"]) == (409, "duplicate_succeeded", "1")
    assert "x-receipt-replayed" not in dup.headers
    assert upstream.seen(path) == 2  # the write made outside the proxy, and the one it forwarded


def test_an_already_exists_answer_not_found_goes_to_manual_review(clients, proxy, upstream, bucket):
    path = f"/api/{bucket}/posts"
    upstream.plan(path, "409")
    answer = clients.send("curl", "POST", upstream.url + path, {"title": "ghost"})
    assert (answer.status, answer.headers["x-receipt-state"]) == (409, "manual_review")
    (receipt,) = receipts_for(proxy, bucket, "posts")
    assert receipt.state == "manual_review"
    assert "does not say this read proves absence" in reasons(proxy, receipt.operation_id)[-1]
    assert upstream.commits(path) == 0 and upstream.reads(path) == 1


def test_an_expired_idempotency_key_is_not_taken_as_a_safe_resend(clients, proxy, upstream, bucket):
    path = f"/api/{bucket}/charges"
    r = unknown_write(clients, proxy, upstream, bucket, "charges", {"amount": 500}, "drop")
    wait_for(
        lambda: (dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(r.submitted_at)).total_seconds() > 1.2,
        interval=0.1,
        what="the key's 1s ttl to pass",
    )
    dup = clients.send("requests", "POST", upstream.url + path, {"amount": 500})
    # Within the ttl this would be safe_to_retry and resent with the key; now the API may have
    # forgotten the key, and with no read configured the receipt stays blocked for a human.
    assert (dup.status, dup.json()["state"]) == (409, "outcome_unknown")
    assert not any("reconciling" in h or "safe_to_retry" in h for h in reasons(proxy, r.operation_id))
    assert upstream.commits(path) == 1 and upstream.seen(path) == 1  # the dropped write; never sent again
