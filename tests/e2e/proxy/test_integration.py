"""
End to end: real mitmdump + the addon, a real upstream on 127.0.0.1, real clients.

Every case asserts what the upstream committed (it counts), the receipt's state and
events, and what the client got; then what an identical retry gets.
"""

from __future__ import annotations

import signal
import sqlite3
import threading

import pytest

from proxy_addon.store import Receipt, Store
from tests.conftest import at_once, wait_for
from tests.e2e.processes import CLIENTS, Answer, Clients, Proxy, next_hop
from tests.upstream import Upstream, free_port


def receipts_for(proxy: Proxy, bucket: str) -> list[Receipt]:
    store = Store.open(proxy.db, create=False)
    try:
        return sorted(
            (r for r in store.list(limit=None) if f"/api/{bucket}/" in r.target), key=lambda r: r.submitted_at
        )
    finally:
        store.close()


def events_of(proxy: Proxy, operation_id: str) -> list[tuple[str, str | None, str]]:
    store = Store.open(proxy.db, create=False)
    try:
        return [(e.event, e.from_state, e.to_state) for e in store.events(operation_id)]
    finally:
        store.close()


def settled(proxy: Proxy, bucket: str, n: int = 1) -> list[Receipt]:
    """The bucket's receipts once there are `n` and none is still submitted."""

    def check():
        rs = receipts_for(proxy, bucket)
        return rs if len(rs) >= n and all(r.state != "submitted" for r in rs) else None

    return wait_for(check, timeout=15, what=f"{n} settled receipt(s) in {bucket}")


def plain(up: Upstream, bucket: str) -> str:
    """The write most tests send: plain.create, which has no reconcile spec (see
    tests/e2e/reconcile/test_reconcile.py)."""
    return f"{up.url}/api/{bucket}/plain"


@pytest.mark.parametrize("client", CLIENTS)
def test_success_then_duplicate_is_replayed(client, clients: Clients, proxy, upstream, bucket):
    url = plain(upstream, bucket)
    first = clients.send(client, "POST", url, {"title": "hello", "n": 1})
    assert first.status == 201, first
    assert first.json()["id"] == 1
    (r,) = settled(proxy, bucket)
    assert (r.state, r.external_id, r.http_status) == ("succeeded", "1", 201)
    assert first.headers["x-receipt-id"] == r.operation_id
    assert events_of(proxy, r.operation_id) == [
        ("transition", None, "submitted"),
        ("transition", "submitted", "succeeded"),
    ]

    # Same intent, other key order and whitespace, a non-allowlisted field changed: replayed.
    again = clients.send(client, "POST", url, b'{ "n": 2,  "title": "hello" }')
    assert again.status == 201
    assert again.headers["x-receipt-replayed"] == "true"
    assert again.headers["x-receipt-id"] == r.operation_id
    assert again.json() == first.json()
    assert "set-cookie" not in again.headers  # never recorded
    assert upstream.commits(f"/api/{bucket}/plain") == 1
    assert events_of(proxy, r.operation_id)[-1] == ("replayed", "succeeded", "succeeded")
    assert len(receipts_for(proxy, bucket)) == 1


@pytest.mark.parametrize("client", CLIENTS)
def test_commit_then_drop_is_outcome_unknown_and_retry_blocked(client, clients, proxy, upstream, bucket):
    url = plain(upstream, bucket)
    upstream.plan(f"/api/{bucket}/plain", "drop")
    first = clients.send(client, "POST", url, {"title": "dropped"})
    assert first.status == 502  # mitmproxy's answer for a vanished upstream
    (r,) = settled(proxy, bucket)
    assert r.state == "outcome_unknown"
    assert "may have reached the upstream" in events_and_reasons(proxy, r.operation_id)[-1]

    retry = clients.send(client, "POST", url, {"title": "dropped"})
    assert retry.status == 409
    body = retry.json()
    assert body["error"] == "duplicate_unresolved"
    assert (body["operation_id"], body["state"]) == (r.operation_id, "outcome_unknown")
    assert "reconcile" in body["hint"]
    assert retry.headers["x-receipt-id"] == r.operation_id
    assert retry.headers["x-receipt-state"] == "outcome_unknown"
    assert upstream.commits(f"/api/{bucket}/plain") == 1
    assert upstream.seen(f"/api/{bucket}/plain") == 1
    assert [e[0] for e in events_of(proxy, r.operation_id)] == ["transition", "transition", "blocked"]


def events_and_reasons(proxy: Proxy, operation_id: str) -> list[str]:
    store = Store.open(proxy.db, create=False)
    try:
        return [e.reason for e in store.events(operation_id)]
    finally:
        store.close()


@pytest.mark.parametrize("client", ["requests", "curl"])
def test_agent_gives_up_but_the_exchange_finishes_and_the_retry_gets_the_answer(
    client, clients, proxy, upstream, bucket
):
    url = plain(upstream, bucket)
    upstream.plan(f"/api/{bucket}/plain", "late")
    first = clients.send(client, "POST", url, {"title": "slow"}, timeout=1)
    assert first.status is None and first.error  # the client gave up after 1 s
    (r,) = settled(proxy, bucket)  # the upstream answered at 2.5 s, after the agent left
    assert (r.state, r.external_id) == ("succeeded", "1")
    retry = clients.send(client, "POST", url, {"title": "slow"})
    assert (retry.status, retry.headers.get("x-receipt-replayed")) == (201, "true")
    assert retry.json()["id"] == 1
    assert upstream.commits(f"/api/{bucket}/plain") == 1


def test_with_mitmproxy_forwarding_an_agent_that_hangs_up_leaves_outcome_unknown(tmp_path, confdir, upstream, bucket):
    proxy = Proxy(tmp_path, confdir, extra=("--set", "receipts_forward=mitmproxy")).start()
    try:
        upstream.plan(f"/api/{bucket}/plain", "hang")
        first = Clients(proxy).send("requests", "POST", plain(upstream, bucket), {"title": "slow"}, timeout=1)
        assert first.status is None
        (r,) = settled(proxy, bucket)
        assert r.state == "outcome_unknown"
        assert "Client disconnected" in (r.error or "")
        retry = Clients(proxy).send("curl", "POST", plain(upstream, bucket), {"title": "slow"})
        assert (retry.status, retry.json()["state"]) == (409, "outcome_unknown")
        assert upstream.commits(f"/api/{bucket}/plain") == 1
    finally:
        proxy.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_connection_refused_is_not_sent_and_retry_goes_through(client, clients, proxy, bucket):
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/{bucket}/plain"
    first = clients.send(client, "POST", url, {"title": "refused"})
    assert first.status == 502
    (r,) = settled(proxy, bucket)
    assert r.state == "not_sent"
    with Upstream(port=port) as late:
        retry = clients.send(client, "POST", url, {"title": "refused"})
        assert retry.status == 201
        assert late.commits(f"/api/{bucket}/plain") == 1
    first_r, second_r = settled(proxy, bucket, 2)
    assert second_r.retry_of == first_r.operation_id
    assert second_r.state == "succeeded"


@pytest.mark.parametrize("fault", ["half", "reset"])
def test_half_a_response_or_a_reset_is_outcome_unknown(fault, clients, proxy, upstream, bucket):
    upstream.plan(f"/api/{bucket}/plain", fault)
    first = clients.send("httpx", "POST", plain(upstream, bucket), {"title": fault})
    assert first.status == 502
    (r,) = settled(proxy, bucket)
    assert r.state == "outcome_unknown"
    assert clients.send("httpx", "POST", plain(upstream, bucket), {"title": fault}).status == 409
    assert upstream.commits(f"/api/{bucket}/plain") == 1


def test_fifty_identical_writes_at_once_reach_upstream_once(proxy, upstream, bucket):
    upstream.plan(f"/api/{bucket}/plain", "slow")
    clients = Clients(proxy)
    answers = at_once(*[lambda: clients.send("requests", "POST", plain(upstream, bucket), {"title": "same"})] * 50)
    assert upstream.commits(f"/api/{bucket}/plain") == 1
    # The 49 duplicates waited for the original's outcome, then got its recorded answer.
    assert [a.status for a in answers] == [201] * 50
    assert sorted(a.headers.get("x-receipt-replayed", "-") for a in answers) == ["-"] + ["true"] * 49
    assert {a.json()["id"] for a in answers} == {1}
    (r,) = settled(proxy, bucket)
    assert r.state == "succeeded"
    assert [e[0] for e in events_of(proxy, r.operation_id)].count("replayed") == 49


def test_two_hundred_different_writes_from_sixteen_clients(proxy, upstream, bucket):
    import requests

    from tests.e2e.processes import SECRETS_HEADERS

    def client(n: int) -> list[int]:
        with requests.Session() as s:
            s.proxies = {"http": proxy.url, "https": proxy.url}
            return [
                s.post(
                    plain(upstream, bucket), json={"title": f"write {i}"}, headers=SECRETS_HEADERS, timeout=30
                ).status_code
                for i in range(n, 200, 16)
            ]

    results = at_once(*[lambda n=n: client(n) for n in range(16)])
    assert sorted(s for r in results for s in r) == [201] * 200
    assert upstream.commits(f"/api/{bucket}/plain") == 200
    rs = settled(proxy, bucket, 200)
    assert [r.state for r in rs] == ["succeeded"] * 200
    assert len({r.intent_fingerprint for r in rs}) == 200
    assert "database is locked" not in proxy.log()


def test_a_duplicate_waits_only_as_long_as_receipts_wait_submitted(tmp_path, confdir, upstream, bucket):
    proxy = Proxy(tmp_path, confdir, extra=("--set", "receipts_wait_submitted=1")).start()
    try:
        upstream.plan(f"/api/{bucket}/plain", "late")
        first: list[Answer] = []
        t = threading.Thread(
            target=lambda: first.append(
                Clients(proxy).send("httpx", "POST", plain(upstream, bucket), {"title": "wait"})
            )
        )
        t.start()
        wait_for(lambda: upstream.seen(f"/api/{bucket}/plain") == 1, what="the original to reach the upstream")
        dup = Clients(proxy).send("requests", "POST", plain(upstream, bucket), {"title": "wait"})
        assert (dup.status, dup.json()["state"]) == (409, "submitted")  # gave up waiting after 1 s
        t.join(timeout=15)
        assert first[0].status == 201  # the original still completed
        assert upstream.commits(f"/api/{bucket}/plain") == 1
    finally:
        proxy.stop()


def test_unmatched_request_passes_untouched(clients, proxy, upstream, bucket):
    before = Store.open(proxy.db, create=False).counts()
    other = clients.send("requests", "POST", f"{upstream.url}/unruled/{bucket}", {"title": "x"})
    get = clients.send("requests", "GET", f"{upstream.url}/api/{bucket}/things")
    assert (other.status, get.status) == (201, 200)
    assert "x-receipt-id" not in other.headers
    assert Store.open(proxy.db, create=False).counts() == before
    assert receipts_for(proxy, bucket) == []
    assert upstream.commits(f"/unruled/{bucket}") == 1


def test_https_upstream_success_replay_and_drop(clients, proxy, tls_upstream, bucket):
    url = plain(tls_upstream, bucket)
    assert url.startswith("https://")
    first = clients.send("httpx", "POST", url, {"title": "tls"})
    assert first.status == 201
    again = clients.send("curl", "POST", url, {"title": "tls"})
    assert (again.status, again.headers.get("x-receipt-replayed")) == (201, "true")
    tls_upstream.plan(f"/api/{bucket}/plain", "drop")
    dropped = clients.send("requests", "POST", url, {"title": "tls drop"})
    assert dropped.status == 502
    blocked = clients.send("requests", "POST", url, {"title": "tls drop"})
    assert blocked.status == 409
    assert tls_upstream.commits(f"/api/{bucket}/plain") == 2
    states = sorted(r.state for r in settled(proxy, bucket, 2))
    assert states == ["outcome_unknown", "succeeded"]


def test_after_success_block_answers_409_with_external_id(clients, proxy, upstream, bucket):
    url = f"{upstream.url}/api/{bucket}/things/7"
    assert clients.send("requests", "PUT", url, {"title": "v2"}).status == 201
    dup = clients.send("requests", "PUT", url, {"title": "v2"})
    assert dup.status == 409
    assert dup.json()["error"] == "duplicate_succeeded"
    assert upstream.commits(f"/api/{bucket}/things/7") == 1


def test_after_success_allow_forwards_a_new_attempt(clients, proxy, upstream, bucket):
    url = f"{upstream.url}/api/{bucket}/things/9"
    assert clients.send("curl", "DELETE", url).status == 201
    assert clients.send("curl", "DELETE", url).status == 201
    assert upstream.commits(f"/api/{bucket}/things/9") == 2
    a, b = settled(proxy, bucket, 2)
    assert b.retry_of == a.operation_id


def test_locked_store_answers_503_and_does_not_forward(tmp_path, confdir, upstream, bucket):
    proxy = Proxy(tmp_path, confdir, extra=("--set", "receipts_lock_timeout=1")).start()
    try:
        holder = sqlite3.connect(proxy.db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            answer = Clients(proxy).send("requests", "POST", plain(upstream, bucket), {"title": "locked"})
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert answer.status == 503
        assert answer.json()["error"] == "receipt_store_unavailable"
        assert answer.json()["sent"] is False
        assert upstream.seen(f"/api/{bucket}/plain") == 0
        assert "NOT forwarded" in proxy.log()
        # Once the lock is gone, the same request goes through.
        assert Clients(proxy).send("requests", "POST", plain(upstream, bucket), {"title": "locked"}).status == 201
        assert upstream.commits(f"/api/{bucket}/plain") == 1
    finally:
        proxy.stop()


def test_upstream_deadline_ends_the_exchange(tmp_path, confdir, upstream, bucket):
    proxy = Proxy(tmp_path, confdir, extra=("--set", "receipts_upstream_timeout=1")).start()
    try:
        upstream.plan(f"/api/{bucket}/plain", "hang")
        answer = Clients(proxy).send("httpx", "POST", plain(upstream, bucket), {"title": "deadline"}, timeout=6)
        assert answer.status == 504
        assert answer.json()["error"] == "outcome_unknown"
        (r,) = settled(proxy, bucket)
        assert r.state == "outcome_unknown"
        assert "receipts_upstream_timeout" in (r.error or "")
    finally:
        proxy.stop()


def test_kill_9_while_upstream_holds_the_write(tmp_path, confdir, upstream, bucket):
    proxy = Proxy(tmp_path, confdir).start()
    upstream.plan(f"/api/{bucket}/plain", "hang")
    answers: list[Answer] = []
    t = threading.Thread(
        target=lambda: answers.append(
            Clients(proxy).send("requests", "POST", plain(upstream, bucket), {"title": "crash"}, timeout=10)
        )
    )
    t.start()
    wait_for(lambda: upstream.seen(f"/api/{bucket}/plain") == 1, what="the upstream to hold the write")
    (r,) = receipts_for(proxy, bucket)
    assert r.state == "submitted"
    proxy.stop(signal.SIGKILL)
    t.join(timeout=15)
    assert answers and answers[0].status is None  # the agent saw the connection die

    restarted = Proxy(tmp_path, confdir, db=proxy.db).start()
    try:
        (r,) = receipts_for(restarted, bucket)
        assert r.state == "outcome_unknown"
        assert events_and_reasons(restarted, r.operation_id)[-1] == "proxy stopped while the request was in flight"
        retry = Clients(restarted).send("curl", "POST", plain(upstream, bucket), {"title": "crash"})
        assert (retry.status, retry.json()["operation_id"]) == (409, r.operation_id)
        assert upstream.commits(f"/api/{bucket}/plain") == 1
    finally:
        restarted.stop()


def test_tls_handshake_failure_is_not_sent(tmp_path, confdir, tls_upstream, bucket):
    """A proxy that does not trust the upstream's certificate fails the handshake: nothing was sent."""
    proxy = Proxy(tmp_path, confdir).start()  # no ssl_verify_upstream_trusted_ca
    try:
        answer = Clients(proxy).send("httpx", "POST", plain(tls_upstream, bucket), {"title": "untrusted"})
        assert answer.status == 502
        (r,) = settled(proxy, bucket)
        assert r.state == "not_sent"
        reason = events_and_reasons(proxy, r.operation_id)[-1]
        assert "never established" in reason and "certificate verify failed" in reason.lower()
        assert tls_upstream.seen(f"/api/{bucket}/plain") == 0
    finally:
        proxy.stop()


def test_two_proxies_sharing_one_db_forward_an_identical_write_once(tmp_path, confdir, upstream, bucket):
    first = Proxy(tmp_path, confdir).start()
    second = Proxy(tmp_path, confdir, db=first.db).start()
    try:
        upstream.plan(f"/api/{bucket}/plain", "slow")
        answers = at_once(
            *[
                lambda p=p: Clients(p).send("httpx", "POST", plain(upstream, bucket), {"title": "shared"})
                for p in [first, second] * 5
            ]
        )
        assert upstream.commits(f"/api/{bucket}/plain") == 1
        assert [a.status for a in answers] == [201] * 10  # the other process's duplicates polled the store
        assert sorted(a.headers.get("x-receipt-replayed", "-") for a in answers) == ["-"] + ["true"] * 9
        (r,) = settled(first, bucket)
        assert r.state == "succeeded"
    finally:
        first.stop()
        second.stop()


def test_receipts_cli_lists_the_blocked_duplicate(clients, proxy, upstream, bucket):
    import json
    import subprocess
    import sys
    from pathlib import Path

    upstream.plan(f"/api/{bucket}/plain", "drop")
    assert clients.send("curl", "POST", plain(upstream, bucket), {"title": "cli"}).status == 502
    assert clients.send("curl", "POST", plain(upstream, bucket), {"title": "cli"}).status == 409
    receipts = Path(sys.executable).parent / "receipts"
    out = subprocess.run(
        [str(receipts), "--db", str(proxy.db), "list", "--json", "--limit", "1000"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    (row,) = [r for r in json.loads(out) if f"/api/{bucket}/" in r["target"]]
    assert (row["state"], row["blocked"], row["replayed"]) == ("outcome_unknown", 1, 0)
    table = subprocess.run(
        [str(receipts), "--db", str(proxy.db), "list", "--state", "outcome_unknown"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert row["operation_id"] in table


def test_upstream_proxy_mode_is_kept_for_matched_requests(tmp_path, confdir, upstream, bucket):
    """mitmproxy's `upstream:` mode: the addon's own exchange goes through the next proxy too."""
    log = tmp_path / "next-proxy.log"
    with next_hop(log, confdir) as next_port:
        proxy = Proxy(tmp_path, confdir, extra=("--mode", f"upstream:http://127.0.0.1:{next_port}")).start()
        try:
            answer = Clients(proxy).send("requests", "POST", plain(upstream, bucket), {"title": "via"})
            assert answer.status == 201
            assert upstream.commits(f"/api/{bucket}/plain") == 1
            wait_for(lambda: f"/api/{bucket}/plain" in log.read_text(), what="the next proxy to log the write")
        finally:
            proxy.stop()


def test_an_https_write_through_the_upstream_proxy_mode_is_sent_once(tmp_path, confdir, tls_upstream, bucket):
    """
    `upstream:` mode to an https upstream: the exchange opens a tunnel (`CONNECT host:port`) through
    the next proxy and sends the write in it, once. (It sent `CONNECT <the write's path>` before
    issue 13's exchange, which mitmproxy answers 502: the write never went.)
    """
    log = tmp_path / "next-proxy.log"
    with next_hop(log, confdir, tls_upstream.cert_path) as next_port:
        proxy = Proxy(
            tmp_path,
            confdir,
            upstream_ca=confdir / "mitmproxy-ca-cert.pem",
            extra=("--mode", f"upstream:http://127.0.0.1:{next_port}"),
        ).start()
        try:
            answer = Clients(proxy).send("httpx", "POST", plain(tls_upstream, bucket), {"title": "via"})
            assert answer.status == 201, answer.body
            path = f"/api/{bucket}/plain"
            assert tls_upstream.commits(path) == 1 and tls_upstream.seen(path) == 1
            (r,) = settled(proxy, bucket)
            assert r.state == "succeeded"
            wait_for(lambda: f"/api/{bucket}/plain" in log.read_text(), what="the next proxy to log the write")
        finally:
            proxy.stop()


def test_an_unruled_409_is_not_a_refusal_and_the_retry_is_blocked(clients, proxy, upstream, bucket):
    """
    A 409 with no rule of its own is `already_exists` (maybe executed), never `rejected`:
    the retry is not forwarded with a fresh key. plain.create has no read: manual review.
    """
    url = plain(upstream, bucket)
    upstream.plan(f"/api/{bucket}/plain", "409")
    first = clients.send("requests", "POST", url, {"title": "conflict"})
    assert (first.status, first.headers["x-receipt-state"]) == (409, "manual_review")
    (r,) = settled(proxy, bucket)
    assert r.state == "manual_review"
    reasons = events_and_reasons(proxy, r.operation_id)
    assert any("evidence that the effect may already exist" in why for why in reasons), reasons
    retry = clients.send("requests", "POST", url, {"title": "conflict"})
    assert (retry.status, retry.json()["error"], retry.json()["state"]) == (
        409,
        "duplicate_unresolved",
        "manual_review",
    )
    assert upstream.seen(f"/api/{bucket}/plain") == 1  # never sent again
