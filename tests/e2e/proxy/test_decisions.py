"""
Decisions on the intent (issue 28 item 1), through a real mitmdump and a real upstream on 127.0.0.1,
on SQLite and PostgreSQL (rules in tests/rules_decisions/):
- a band: a charge of 100000 or more is held for approval (the upstream sees nothing until
  `receipts approve`, then exactly one write), one of 99999 goes straight through;
- a deny sends nothing: 403 denied_by_policy naming the rule, the receipt rejected with its error
  and a "denied by policy" event, a retry denied again, the upstream saw no write;
- a deny in OpenAI's envelope (`errors: openai`): the openai SDK's exception names the rule and the receipt;
- each new write decided is counted in receipt_proxy_rule_decisions_total, a duplicate answered from its
  receipt is not.
Before decisions, every one of these writes was forwarded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import openai
import pytest
import requests

from proxy_addon.states import State
from proxy_addon.store import Receipt, open_store
from proxy_addon.store.records import Event
from tests.conftest import ROOT, deadline, wait_for
from tests.e2e.processes import METRICS_URL, Proxy
from tests.mitm.test_metrics_server import by, scrape

RULES = Path(__file__).parents[2] / "rules_decisions"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def proxy(request, tmp_path_factory, confdir):
    """A proxy on the decisions' rules, on each backend (a SQLite file, or a schema of the session's PostgreSQL)."""
    workdir = tmp_path_factory.mktemp(f"decisions-{request.param}")
    db = request.getfixturevalue("pg_cluster").new_schema() if request.param == "postgres" else None
    p = Proxy(workdir, confdir, db=db, rules=RULES, extra=("--set", "receipts_metrics=127.0.0.1:0"))
    p.start()
    try:
        p.metrics_url = wait_for(lambda: METRICS_URL.search(p.log()), timeout=10, what="the metrics URL").group(1)
        yield p
    finally:
        p.stop()


def receipts_cli(db: Path | str, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a process of its own, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "proxy_addon.cli", "--db", str(db), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=deadline(30),
        env={**os.environ, "LOGNAME": "carol"},
    )


def stored(proxy: Proxy, path: str) -> list[tuple[Receipt, list[Event]]]:
    """The receipts whose target is `path`, oldest first, each with its events."""
    store = open_store(proxy.db, create=False)
    try:
        found = sorted((r for r in store.list(limit=None) if path in r.target), key=lambda r: r.submitted_at)
        return [(r, store.events(r.operation_id)) for r in found]
    finally:
        store.close()


def post(proxy: Proxy, url: str, doc: dict) -> requests.Response:
    return requests.post(url, json=doc, timeout=deadline(30), proxies={"http": proxy.url, "https": proxy.url})


def test_a_band_holds_the_large_charge_until_approved_and_lets_the_small_one_through(proxy, upstream, bucket):
    path = f"/api/{bucket}/charges"
    small = post(proxy, upstream.url + path, {"amount": 99999, "currency": "eur"})
    assert small.status_code == 201, small.text
    assert upstream.seen(path) == upstream.commits(path) == 1

    got: list = []

    def agent() -> None:
        try:
            got.append(post(proxy, upstream.url + path, {"amount": 100000, "currency": "eur"}))
        except requests.RequestException as e:
            got.append(e)

    held_thread = threading.Thread(target=agent)
    held_thread.start()
    try:
        held = wait_for(
            lambda: next((r for r, _ in stored(proxy, path) if r.state is State.AWAITING_APPROVAL), None),
            timeout=15,
            what="the large charge to be held",
        )
        assert upstream.seen(path) == 1  # only the small one: the large one waits
        (allowed, _), (_, held_events) = stored(proxy, path)
        assert allowed.state is State.SUCCEEDED and allowed.operation_id == small.headers["x-receipt-id"]
        assert [e.to_state for e in held_events] == [State.AWAITING_APPROVAL]

        approved = receipts_cli(
            proxy.db, "approve", held.operation_id, "--fingerprint", held.intent_fingerprint, "--note", "agreed"
        )
        assert approved.returncode == 0, approved.stderr
    finally:  # the agent's own timeout ends it if the approval did not come
        held_thread.join(timeout=deadline(40))
    (answer,) = got
    assert isinstance(answer, requests.Response) and answer.status_code == 201, answer
    assert answer.headers["x-receipt-id"] == held.operation_id
    assert upstream.seen(path) == upstream.commits(path) == 2  # the small one, then the approved one once
    ((final, events),) = [(r, ev) for r, ev in stored(proxy, path) if r.operation_id == held.operation_id]
    assert final.state is State.SUCCEEDED
    assert [e.to_state for e in events] == [State.AWAITING_APPROVAL, State.SUBMITTED, State.SUCCEEDED]


def test_a_deny_sends_nothing_and_a_retry_is_denied_again(proxy, upstream, bucket):
    path = f"/api/{bucket}/emails"
    mail = {"to": "someone@elsewhere.test", "subject": "the figures"}
    first = post(proxy, upstream.url + path, mail)
    again = post(proxy, upstream.url + path, mail)

    assert upstream.seen(path) == 0
    receipts = stored(proxy, path)
    assert len(receipts) == 2
    for answer, (receipt, events) in zip((first, again), receipts, strict=True):
        assert answer.status_code == 403, answer.text
        body = answer.json()
        assert (body["error"], body["sent"], body["state"]) == ("denied_by_policy", False, "rejected")
        assert "decisions[0] (line 16)" in body["detail"] and "mail leaves the company" in body["detail"]
        assert body["operation_id"] == receipt.operation_id == answer.headers["x-receipt-id"]
        assert receipt.state is State.REJECTED and receipt.idempotency_key is None
        assert receipt.error is not None and receipt.error.startswith("denied by policy decisions[0] (line 16)")
        assert "mail leaves the company" in receipt.error
        (event,) = events
        assert event.to_state is State.REJECTED and event.reason.startswith("denied by policy decisions[0]")
        assert event.reason.endswith("; not sent")
    assert receipts[1][0].retry_of == receipts[0][0].operation_id

    inside = post(proxy, upstream.url + path, {"to": "colleague@example.com", "subject": "the figures"})
    assert inside.status_code == 201, inside.text
    assert upstream.seen(path) == upstream.commits(path) == 1  # a mail inside the company is allowed


def test_a_deny_through_the_openai_sdk_names_the_rule_and_the_receipt(proxy, upstream, bucket, monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, proxy.url)
    for name in ("NO_PROXY", "no_proxy"):  # 127.0.0.1 must go through the proxy
        monkeypatch.setenv(name, "")
    path = f"/api/{bucket}/v1/chat/completions"
    client = openai.OpenAI(base_url=f"{upstream.url}/api/{bucket}/v1", api_key="sk-test-not-a-secret", max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as info:
        client.chat.completions.create(model="gpt-forbidden", messages=[{"role": "user", "content": "write"}])

    ((r, _),) = stored(proxy, path)
    e = info.value
    assert r.state is State.REJECTED
    assert r.operation_id in str(e) and "this model is not for agents" in str(e) and "decisions[0]" in str(e)
    assert e.code == "denied_by_policy"
    assert isinstance(e.body, dict) and e.body["receipt_proxy"]["operation_id"] == r.operation_id
    assert "sk-test-not-a-secret" not in str(e)
    assert upstream.seen(path) == 0


def decided(proxy: Proxy) -> dict[tuple[str, ...], float]:
    return by(scrape(proxy.metrics_url)[1], "receipt_proxy_rule_decisions_total", "api", "operation", "decision")


def test_each_new_write_decided_is_counted_once(proxy, upstream, bucket):
    before = decided(proxy)
    charge = {"amount": 250, "currency": "eur"}
    assert post(proxy, f"{upstream.url}/api/{bucket}/charges", charge).status_code == 201
    replayed = post(proxy, f"{upstream.url}/api/{bucket}/charges", charge)  # a duplicate: no new decision
    assert (replayed.status_code, replayed.headers.get("x-receipt-replayed")) == (201, "true")
    mail = {"to": "x@elsewhere.test", "subject": "s"}
    assert post(proxy, f"{upstream.url}/api/{bucket}/emails", mail).status_code == 403
    after = decided(proxy)
    grew = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
    assert grew == {("pay-test", "charges.create", "allow"): 1.0, ("pay-test", "emails.send", "deny"): 1.0}
    duplicates = by(scrape(proxy.metrics_url)[1], "receipt_proxy_duplicates_total", "api", "operation", "answer")
    assert ("pay-test", "emails.send", "blocked") not in duplicates  # a denied write is no duplicate
