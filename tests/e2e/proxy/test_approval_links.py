"""
Approvals that reach people, end to end on each backend: a real mitmdump holds a write
(`approve: true`), POSTs the signed notice to a webhook receiver this test runs on 127.0.0.1,
and a person follows the notice's links with requests (GET shows, POST decides). The upstream
counts what was sent. The proxy's own endpoint serves the links (receipts_approval_listen).
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from proxy_addon.states import State
from proxy_addon.store import open_store
from tests.conftest import ROOT, SECRETS, deadline, wait_for
from tests.e2e.processes import Proxy

WEBHOOK_SECRET = b"webhook-secret-for-tests-3b9f"
APPROVAL_TIMEOUT = 120  # seconds: far longer than any test needs, so that only the expiry test sees a timeout


class Receiver:
    """A webhook receiver on 127.0.0.1: records each POST (headers, exact body); answers `status`."""

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook/SECRET-PATH-IN-URL"

    def notice(self, bucket: str) -> tuple[dict[str, str], bytes]:
        """The notice about the write held for `bucket` (waits for it)."""

        def find():
            return next(((h, b) for h, b in self.got if bucket.encode() in b), None)

        return wait_for(find, timeout=deadline(15), what="the approval webhook")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def verify_as_documented():
    """The receiver's check docs/operations.md shows, run as written."""
    text = (ROOT / "docs" / "operations.md").read_text()
    block = text[text.index("**The signature.**") :]
    code = block[block.index("```python\n") + len("```python\n") :]
    scope: dict = {}
    exec(code[: code.index("```")], scope)
    return scope["verify"]


def start_proxy(
    workdir: Path, confdir: Path, db: str, receiver: Receiver, *, timeout: int, key: Path | None = None
) -> Proxy:
    secret = workdir / "webhook.secret"
    secret.write_bytes(WEBHOOK_SECRET + b"\n")
    extra = [
        "--set",
        f"receipts_approval_webhook={receiver.url}",
        "--set",
        f"receipts_approval_webhook_secret={secret}",
        "--set",
        "receipts_approval_listen=127.0.0.1:0",
        "--set",
        f"receipts_approval_timeout={timeout}",
    ]
    if db.startswith("postgresql"):  # a fleet's proxies share one secret.key
        extra += ["--set", f"receipts_secret={key or workdir / 'secret.key'}"]
    return Proxy(workdir, confdir, db=db, extra=tuple(extra)).start()


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def db(request, tmp_path_factory) -> str:
    if request.param == "postgres":
        return request.getfixturevalue("pg_cluster").new_schema()
    return str(tmp_path_factory.mktemp("approval-links") / "receipts.db")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, confdir, db, receiver):
    p = start_proxy(tmp_path_factory.mktemp("linked"), confdir, db, receiver, timeout=APPROVAL_TIMEOUT)
    yield p
    p.stop()


def browser() -> requests.Session:
    s = requests.Session()
    s.trust_env = False  # straight to the proxy's endpoint, as a browser on this host
    return s


def send_held(proxy: Proxy, url: str, amount: int) -> tuple[threading.Thread, list]:
    """An agent's write, held: its answer (or error) lands in the list once decided."""
    got: list = []

    def agent():
        try:
            got.append(
                requests.post(
                    url,
                    json={"amount": amount, "memo": SECRETS["blob"]},  # memo: a field the fingerprint does not name
                    headers={"Authorization": SECRETS["authorization"]},
                    timeout=deadline(60),
                    proxies={"http": proxy.url, "https": proxy.url},
                )
            )
        except requests.RequestException as e:
            got.append(e)

    t = threading.Thread(target=agent)
    t.start()
    return t, got


def receipt(db: str, operation_id: str):
    s = open_store(db, create=False)
    try:
        return s.get(operation_id), s.events(operation_id)
    finally:
        s.close()


def test_the_signed_notice_and_its_approve_link_send_the_write_exactly_once(proxy, receiver, upstream, bucket, db):
    path = f"/api/{bucket}/refunds"
    agent, got = send_held(proxy, upstream.url + path, 250000)
    headers, body = receiver.notice(bucket)

    # Signed as documented: HMAC-SHA256 over "<timestamp>.<body>", checked with docs/operations.md's code.
    verify = verify_as_documented()
    assert headers["content-type"] == "application/json"
    assert verify(WEBHOOK_SECRET, body, headers["x-receipt-timestamp"], headers["x-receipt-signature"])
    assert not verify(b"another secret", body, headers["x-receipt-timestamp"], headers["x-receipt-signature"])
    assert not verify(WEBHOOK_SECRET, body + b" ", headers["x-receipt-timestamp"], headers["x-receipt-signature"])
    for secret in SECRETS.values():  # neither the Authorization header nor the body's other field
        assert secret.encode() not in body
    notice = json.loads(body)
    rid = notice["receipt"]["id"]
    r = notice["receipt"]
    assert (r["api"], r["operation"], r["method"], r["state"]) == (
        "test-api",
        "refunds.create",
        "POST",
        "awaiting_approval",
    )
    assert r["target"] == upstream.url + path and r["fingerprint"].startswith("sha256:")
    assert r["rules_version"].startswith("p1:") and r["expires_at"] > r["submitted_at"]
    assert notice["intent"] == {"body": {"amount": 250000}, "path": {"bucket": bucket}}
    assert notice["event"] == "approval_requested"
    approve, deny = notice["links"]["approve"], notice["links"]["deny"]
    assert f"<{approve}|Approve>" in notice["text"] and f"<{deny}|Deny>" in notice["text"]
    assert "refunds.create" in notice["text"] and "250000" in notice["text"]

    web = browser()
    shown = web.get(approve, timeout=deadline(10))  # a GET shows the write and decides nothing
    assert shown.status_code == 200 and "Approve this write?" in shown.text and "250000" in shown.text
    assert shown.headers["Referrer-Policy"] == "no-referrer"
    time.sleep(1.5)  # the holding proxy looks for decisions every 0.5 s: none may be found
    assert upstream.seen(path) == 0 and receipt(db, rid)[0].state == "awaiting_approval"
    tampered = approve[:-3] + ("000" if not approve.endswith("000") else "111")
    assert web.post(tampered, timeout=deadline(10)).status_code == 404

    decided = web.post(approve, timeout=deadline(15))
    assert decided.status_code == 200, decided.text
    assert "The write was approved." in decided.text
    agent.join(timeout=deadline(30))
    (answer,) = got
    assert answer.status_code == 201 and answer.headers["x-receipt-id"] == rid
    assert upstream.seen(path) == upstream.commits(path) == 1

    again = web.post(approve, timeout=deadline(10))
    assert again.status_code == 409 and "This link was used already" in again.text
    assert web.get(approve, timeout=deadline(10)).status_code == 409
    other = web.post(deny, timeout=deadline(10))
    assert other.status_code == 409 and "succeeded" in other.text
    time.sleep(1.5)
    assert upstream.seen(path) == 1

    r2, events = receipt(db, rid)
    assert r2.state == "succeeded"
    (released,) = [e for e in events if e.from_state == "awaiting_approval"]
    assert released.to_state == "submitted" and released.actor == "link:127.0.0.1"


def test_a_deny_link_denies_and_a_failing_webhook_leaves_the_write_held(proxy, receiver, upstream, bucket, db):
    path = f"/api/{bucket}/refunds"
    receiver.status = 500
    try:
        agent, got = send_held(proxy, upstream.url + path, 999999)
        _, body = receiver.notice(bucket)
        wait_for(lambda: "approval webhook" in proxy.log() and "failed (it answered 500)" in proxy.log(), timeout=10)
    finally:
        receiver.status = 200
    assert "SECRET-PATH-IN-URL" not in proxy.log()  # the webhook's URL is logged by its host only
    notice = json.loads(body)
    rid, deny = notice["receipt"]["id"], notice["links"]["deny"]
    time.sleep(1)
    assert receipt(db, rid)[0].state == "awaiting_approval" and not got  # still held, the agent still waits

    web = browser()
    page = web.get(deny, timeout=deadline(10))
    assert page.status_code == 200 and "Deny this write?" in page.text
    decided = web.post(deny, data={"note": "too much for one refund"}, timeout=deadline(15))
    assert decided.status_code == 200 and "The write was denied." in decided.text
    agent.join(timeout=deadline(30))
    (answer,) = got
    assert answer.status_code == 403
    assert answer.json()["reason"] == "denied by operator: too much for one refund"
    assert upstream.seen(path) == 0
    assert web.post(deny, timeout=deadline(10)).status_code == 409
    r, events = receipt(db, rid)
    assert (r.state, r.error) == ("rejected", "denied by operator: too much for one refund")
    assert events[-1].actor == "link:127.0.0.1"
    assert upstream.seen(path) == 0


def test_an_expired_link_is_refused_and_the_timeout_is_a_recorded_denial(
    tmp_path, confdir, db, proxy, receiver, upstream, bucket
):
    path = f"/api/{bucket}/refunds"
    p = start_proxy(tmp_path, confdir, db, receiver, timeout=2, key=proxy.workdir / "secret.key")
    try:
        agent, got = send_held(p, upstream.url + path, 31)
        _, body = receiver.notice(bucket)
        notice = json.loads(body)
        rid, approve = notice["receipt"]["id"], notice["links"]["approve"]
        agent.join(timeout=deadline(30))
        (answer,) = got
        assert answer.status_code == 403 and "no decision within receipts_approval_timeout" in answer.json()["reason"]
        wait_for(lambda: time.time() >= _expires(approve), timeout=10, what="the link to expire")
        web = browser()
        for follow in (web.get, web.post):
            late = follow(approve, timeout=deadline(10))
            assert late.status_code == 410 and "expired" in late.text
        time.sleep(1)
        assert upstream.seen(path) == 0
        r, events = receipt(db, rid)
        assert (r.state, r.error) == ("rejected", "denied: no decision within receipts_approval_timeout (2s)")
        assert State(r.state) is State.REJECTED  # a proven refusal: nothing left, a retry is a new write
        assert (events[-1].from_state, events[-1].to_state, events[-1].actor) == (
            "awaiting_approval",
            "rejected",
            "proxy",
        )
    finally:
        p.stop()


def _expires(url: str) -> int:
    """A link's expiry, read from its (signed, base64url JSON) payload."""
    import base64

    payload = re.search(r"/approvals/([A-Za-z0-9_-]+)\.", url)
    assert payload
    text = payload.group(1)
    return json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))["e"]
