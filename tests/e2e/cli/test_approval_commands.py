"""
`receipts approve` and `receipts deny` from another process against a running mitmdump that holds a
write: the decision applied within a second, one write or none upstream; a write whose proxy is gone
is held by no one. In-process: tests/cli/test_approval_commands.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from proxy_addon.states import State
from proxy_addon.store import Store
from tests.cli.conftest import table
from tests.cli.test_approval_commands import PENDING_HEADERS, everything
from tests.conftest import ROOT, deadline, wait_for
from tests.e2e.processes import Proxy


def receipts(db: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a process of its own, as an operator runs it (this checkout's code)."""
    return subprocess.run(
        [sys.executable, "-m", "proxy_addon.cli", "--db", str(db), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=deadline(30),
        env={**os.environ, "LOGNAME": "carol"},
    )


@pytest.fixture(scope="module")
def proxy_holding(tmp_path_factory, confdir):
    p = Proxy(tmp_path_factory.mktemp("approvals"), confdir)
    p.start()
    yield p
    p.stop()


def send_held(proxy: Proxy, url: str, amount: int) -> tuple[threading.Thread, list]:
    got: list = []

    def agent():
        try:
            got.append(
                requests.post(url, json={"amount": amount}, timeout=30, proxies={"http": proxy.url, "https": proxy.url})
            )
        except requests.RequestException as e:
            got.append(e)

    t = threading.Thread(target=agent)
    t.start()
    return t, got


def held_id(db: Path, bucket: str) -> str:
    def find():
        s = Store.open(db, create=False)
        try:
            return next((r.operation_id for r in s.list(states=[State.AWAITING_APPROVAL]) if bucket in r.target), None)
        finally:
            s.close()

    return wait_for(find, timeout=15, what="the write to be held")


def test_an_approval_from_another_process_sends_one_write(proxy_holding, upstream, bucket):
    path = f"/api/{bucket}/refunds"
    agent, got = send_held(proxy_holding, upstream.url + path, 10)
    rid = held_id(proxy_holding.db, bucket)
    shown = receipts(proxy_holding.db, "pending")
    assert shown.returncode == 0, shown.stderr
    (row,) = [r for r in table(shown.stdout, PENDING_HEADERS) if r["ID"] == rid]
    assert (row["PROXY"], row["OPERATION"], row["DECISION"], row["INTENT"]) == (
        f"pid:{proxy_holding.proc.pid}",
        "test-api/refunds.create",
        "-",
        f'{{"body":{{"amount":10}},"path":{{"bucket":"{bucket}"}}}}',
    )
    refused = receipts(proxy_holding.db, "approve", rid, "--fingerprint", "sha256:00000000")
    assert (refused.returncode, refused.stdout) == (1, "") and "not the write you meant" in refused.stderr
    assert upstream.seen(path) == 0  # still held

    started = time.monotonic()
    approved = receipts(
        proxy_holding.db,
        "approve",
        rid,
        "--note",
        "refund agreed",
        "--fingerprint",
        row["FINGERPRINT"],
        "--wait",
        f"{deadline(5):.0f}",
    )
    wait_for(lambda: upstream.commits(path) == 1, timeout=5, what="the approved write upstream")
    took = time.monotonic() - started
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.startswith(f"{rid} is now ") and approved.stdout.endswith(
        "(was awaiting_approval): approved by cli:carol: refund agreed\n"
    )
    agent.join(timeout=30)
    (answer,) = got
    assert (answer.status_code, answer.headers["x-receipt-id"]) == (201, rid)
    # The proxy looks every 0.5 s: 1 s with the CLI's start on a quiet machine; never the 300 s approval timeout.
    assert took < deadline(10), f"the write went upstream {took:.2f}s after `receipts approve` started"
    assert upstream.seen(path) == upstream.commits(path) == 1

    again = receipts(proxy_holding.db, "approve", rid)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr == (
        f"Error: receipt {rid} is succeeded, not awaiting_approval: only a write held for "
        "approval can be approved or denied\n"
    )
    s = Store.open(proxy_holding.db, create=False)
    ev = [e for e in s.events(rid) if e.from_state == "awaiting_approval"]
    assert [(e.to_state, e.actor, e.reason) for e in ev] == [
        ("submitted", "cli:carol", "approved by operator: refund agreed")
    ]
    decision = s.approval_decision(rid)
    assert s.get(rid).state == "succeeded" and decision is not None and decision.consumed_at is not None
    s.close()
    assert upstream.seen(path) == 1


def test_a_denial_from_another_process_answers_403_and_sends_nothing(proxy_holding, upstream, bucket):
    path = f"/api/{bucket}/refunds"
    agent, got = send_held(proxy_holding, upstream.url + path, 20)
    rid = held_id(proxy_holding.db, bucket)
    denied = receipts(proxy_holding.db, "deny", rid, "--note", "amount too high")
    assert (denied.returncode, denied.stderr) == (0, "")
    assert denied.stdout == f"{rid} is now rejected (was awaiting_approval): denied by cli:carol: amount too high\n"
    agent.join(timeout=30)
    (answer,) = got
    assert answer.status_code == 403
    assert {k: answer.json()[k] for k in ("error", "operation_id", "reason", "sent")} == {
        "error": "denied_by_operator",
        "operation_id": rid,
        "reason": "denied by operator: amount too high",
        "sent": False,
    }
    assert upstream.seen(path) == 0
    s = Store.open(proxy_holding.db, create=False)
    r, last = s.get(rid), s.events(rid)[-1]
    s.close()
    assert (r.state, r.error) == ("rejected", "denied by operator: amount too high")
    assert (last.actor, last.reason) == ("cli:carol", "denied by operator: amount too high")
    assert receipts(proxy_holding.db, "pending").stdout.count(rid) == 0


def test_a_write_whose_proxy_is_gone_is_not_held_by_anyone(tmp_path, confdir, upstream, bucket):
    """The proxy is killed while it holds a write: nothing can approve it; its next start records not_sent."""
    path = f"/api/{bucket}/refunds"
    proxy = Proxy(tmp_path, confdir).start()
    assert isinstance(proxy.db, Path)  # a SQLite file
    try:
        agent, got = send_held(proxy, upstream.url + path, 30)
        rid = held_id(proxy.db, bucket)
        proxy.stop(signal.SIGKILL)
        agent.join(timeout=30)
        assert isinstance(got[0], requests.RequestException)  # the agent lost its connection; nothing was sent
        shown = receipts(proxy.db, "pending")
        assert [r["PROXY"] for r in table(shown.stdout, PENDING_HEADERS) if r["ID"] == rid] == ["stopped"]
        before = everything(proxy.db)
        refused = receipts(proxy.db, "approve", rid)
        assert (
            refused.returncode == 1
            and "has stopped; nothing was sent, and the next proxy start records it not_sent" in refused.stderr
        )
        assert everything(proxy.db) == before
        proxy.start()  # recovery
        s = Store.open(proxy.db, create=False)
        r = s.get(rid)
        s.close()
        assert (r.state, r.error) == ("not_sent", "proxy stopped while the request awaited approval")
        assert upstream.seen(path) == 0
    finally:
        proxy.stop()
