"""
Stopping the proxy (issue 11, item 5): SIGTERM or SIGINT drains, a second signal exits at once.

Real mitmdump processes (tests/conftest.py `Proxy`; mitmweb through scripts/run once), the
real upstream holding a write until the test lets it go (the "held" fault), real clients.
What each test checks is what the agent got, what the upstream saw, the receipt's state and
history, and how and when the process ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from proxy_addon.store import Store
from tests.conftest import deadline, wait_for
from tests.e2e.processes import Answer, Clients, Proxy, ScriptsRun

STOPPING = "stopping; waiting up to"  # the proxy's log line once it drains


def receipts(db: Path | str, bucket: str):
    store = Store.open(db, create=False)
    try:
        found = [r for r in store.list(limit=None) if bucket in r.target]
        return [(r, [e.reason for e in store.events(r.operation_id)]) for r in found]
    finally:
        store.close()


def in_background(proxy: Proxy, url: str, body: dict, *, client: str = "requests", timeout: float = 30):
    """Send a write in a thread; the answer lands in the returned list."""
    got: list[Answer] = []
    t = threading.Thread(target=lambda: got.append(Clients(proxy).send(client, "POST", url, body, timeout=timeout)))
    t.start()
    return t, got


def signal_proxy(proxy: Proxy, sig: int) -> float:
    assert proxy.proc is not None and proxy.proc.poll() is None
    os.kill(proxy.proc.pid, sig)
    return time.monotonic()


def exit_code(proxy: Proxy, timeout: float) -> int:
    assert proxy.proc is not None
    try:
        return proxy.proc.wait(timeout=deadline(timeout))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the proxy did not exit within {deadline(timeout):.0f}s:\n{proxy.log()}") from None


def draining(proxy: Proxy) -> None:
    wait_for(
        lambda: STOPPING in proxy.log() or proxy.process.poll() is not None,
        timeout=10,
        what="the proxy to say it drains",
    )
    assert proxy.process.poll() is None, f"the proxy exited instead of draining:\n{proxy.log()}"


@pytest.mark.parametrize(
    "sig, forward",
    [(signal.SIGTERM, "addon"), (signal.SIGINT, "addon"), (signal.SIGTERM, "mitmproxy")],
    ids=["SIGTERM", "SIGINT", "SIGTERM-receipts_forward=mitmproxy"],
)
def test_a_signal_lets_the_write_in_flight_end_then_exits_0(sig, forward, tmp_path, confdir, upstream, bucket):
    """(1), (5): the agent gets the upstream's real answer, the receipt is succeeded, exit 0."""
    # receipts_drain_timeout: the default, 30 s
    proxy = Proxy(tmp_path, confdir, extra=("--set", f"receipts_forward={forward}")).start()
    path = f"/api/{bucket}/plain"
    upstream.plan(path, "held")
    try:
        t, got = in_background(proxy, upstream.url + path, {"title": "in flight"})
        wait_for(lambda: upstream.seen(path) == 1, what="the upstream to hold the write")
        sent = signal_proxy(proxy, sig)
        draining(proxy)
        time.sleep(0.5)
        assert proxy.process.poll() is None  # still there: it waits for the write in flight
        upstream.let_go(path)
        t.join(timeout=15)
        assert got and got[0].status == 201, got
        assert got[0].headers["x-receipt-state"] == "succeeded"
        assert exit_code(proxy, timeout=10) == 0
        assert time.monotonic() - sent < 15  # well within the 30 s drain
    finally:
        upstream.let_go(path)
        proxy.stop()
    [(receipt, reasons)] = receipts(proxy.db, bucket)
    assert (receipt.state, receipt.http_status, receipt.error) == ("succeeded", 201, None)
    assert not any("stopped" in r for r in reasons)
    assert got[0].json()["id"] == int(receipt.external_id)
    assert (upstream.seen(path), upstream.commits(path)) == (1, 1)
    assert "every matched request in flight has its outcome; exiting" in proxy.log()


def test_a_new_write_while_draining_is_not_sent(tmp_path, confdir, upstream, bucket):
    """(2): 503 not_sent, sent false, no receipt, and the upstream never sees it; unmatched traffic still flows."""
    proxy = Proxy(tmp_path, confdir).start()
    path, other = f"/api/{bucket}/plain", f"/api/{bucket}/things"
    upstream.plan(path, "held")
    try:
        t, got = in_background(proxy, upstream.url + path, {"title": "in flight"})
        wait_for(lambda: upstream.seen(path) == 1, what="the upstream to hold the write")
        signal_proxy(proxy, signal.SIGTERM)
        draining(proxy)
        for client in ("requests", "curl"):
            new = Clients(proxy).send(client, "POST", upstream.url + other, {"title": f"new via {client}"})
            assert new.status == 503, (client, new)
            body = new.json()
            assert (body["error"], body["sent"]) == ("not_sent", False)
            assert "safe to send the request again" in body["hint"]
            assert "x-receipt-id" not in new.headers
        # Unmatched traffic keeps flowing while the proxy drains: a GET (a read) passes through.
        read = Clients(proxy).send("requests", "GET", upstream.url + other)
        assert read.status == 200
        upstream.let_go(path)
        t.join(timeout=15)
        assert got and got[0].status == 201
        assert exit_code(proxy, timeout=10) == 0
    finally:
        upstream.let_go(path)
        proxy.stop()
    assert upstream.seen(other) == 0
    assert [r.state for r, _ in receipts(proxy.db, bucket)] == ["succeeded"]  # none for the refused writes
    assert "NOT forwarded: the proxy is stopping" in proxy.log()


def test_a_second_signal_exits_at_once_and_recovery_blocks_the_duplicate(tmp_path, confdir, upstream, bucket):
    """(3): exit at once; the next start leaves the write outcome_unknown; a duplicate is blocked, never sent."""
    proxy = Proxy(tmp_path, confdir).start()
    path = f"/api/{bucket}/plain"
    upstream.plan(path, "held")
    try:
        t, got = in_background(proxy, upstream.url + path, {"title": "in flight"})
        wait_for(lambda: upstream.seen(path) == 1, what="the upstream to hold the write")
        signal_proxy(proxy, signal.SIGTERM)
        draining(proxy)
        again = signal_proxy(proxy, signal.SIGTERM)
        exit_code(proxy, timeout=5)
        assert time.monotonic() - again < 15  # at once (0.2 s on a quiet machine): not after the 30 s drain
        t.join(timeout=15)
        assert got and got[0].status != 201  # the agent never got a success it could count on
    finally:
        upstream.let_go(path)
        proxy.stop()
    assert "again: exiting now" in proxy.log()

    restarted = Proxy(tmp_path, confdir, db=proxy.db).start()
    try:
        [(receipt, _)] = receipts(restarted.db, bucket)
        assert receipt.state == "outcome_unknown"
        dup = Clients(restarted).send("curl", "POST", upstream.url + path, {"title": "in flight"})
        assert (dup.status, dup.json()["error"], dup.json()["operation_id"]) == (
            409,
            "duplicate_unresolved",
            receipt.operation_id,
        )
    finally:
        restarted.stop()
    assert upstream.seen(path) == 1  # never a second write


@pytest.mark.parametrize("forward", ["addon", "mitmproxy"])
def test_a_write_that_outlasts_the_drain_timeout_is_recorded_outcome_unknown(
    forward, tmp_path, confdir, upstream, bucket
):
    """(4): exit after receipts_drain_timeout; the receipt says the proxy stopped, recorded before the exit."""
    proxy = Proxy(
        tmp_path, confdir, extra=("--set", "receipts_drain_timeout=1", "--set", f"receipts_forward={forward}")
    ).start()
    path = f"/api/{bucket}/plain"
    upstream.plan(path, "held")  # held up to hang_seconds (8 s): longer than the drain
    try:
        t, got = in_background(proxy, upstream.url + path, {"title": "too slow"})
        wait_for(lambda: upstream.seen(path) == 1, what="the upstream to hold the write")
        sent = signal_proxy(proxy, signal.SIGTERM)
        assert exit_code(proxy, timeout=8) == 0
        took = time.monotonic() - sent
        # It drained first; that it did not wait for the held write (8 s): the agent's 502 and the receipt below.
        assert took >= 1, took
        t.join(timeout=15)
        # The agent is told the truth: maybe sent, do not resend blindly (mitmproxy's own 502 when it forwards).
        assert got and got[0].status == 502, got
        if forward == "addon":
            answer = got[0].json()
            assert (answer["error"], answer["state"]) == ("outcome_unknown", "outcome_unknown")
            assert "receipts_drain_timeout" in answer["detail"]
        # Recorded before the exit, by this process, not by the next start's recovery.
        [(receipt, reasons)] = receipts(proxy.db, bucket)
        assert receipt.state == "outcome_unknown"
        assert "the proxy stopped: receipts_drain_timeout (1s) passed" in receipt.error
        assert not any("proxy stopped while the request was in flight" in r for r in reasons)
    finally:
        upstream.let_go(path)
        proxy.stop()

    restarted = Proxy(tmp_path, confdir, db=proxy.db).start()
    try:
        dup = Clients(restarted).send("requests", "POST", upstream.url + path, {"title": "too slow"})
        assert (dup.status, dup.json()["operation_id"]) == (409, receipt.operation_id)
    finally:
        restarted.stop()
    assert upstream.seen(path) == 1


def test_a_reconcile_read_in_progress_ends_before_the_exit(tmp_path, confdir, upstream, bucket):
    """A duplicate's read, running when the signal comes, settles the receipt; the duplicate is answered."""
    proxy = Proxy(tmp_path, confdir).start()
    path = f"/api/{bucket}/things"
    upstream.plan(path, "drop")  # committed upstream, then the connection drops: outcome_unknown
    try:
        first = Clients(proxy).send("requests", "POST", upstream.url + path, {"title": "read me"})
        assert (first.status, first.json()["error"]) == (502, "outcome_unknown")
        upstream.plan_read(path, "held")
        t, got = in_background(proxy, upstream.url + path, {"title": "read me"})
        wait_for(lambda: upstream.reads(path) == 1, what="the duplicate's read to reach the upstream")
        signal_proxy(proxy, signal.SIGTERM)
        draining(proxy)
        time.sleep(0.5)
        assert proxy.process.poll() is None  # it waits for the read
        upstream.let_go(path)
        t.join(timeout=15)
        assert got and got[0].status == 409, got
        assert got[0].json()["error"] == "duplicate_succeeded"  # found by the read: never sent again
        assert exit_code(proxy, timeout=10) == 0
    finally:
        upstream.let_go(path)
        proxy.stop()
    [(receipt, _)] = receipts(proxy.db, bucket)
    assert (receipt.state, receipt.external_id) == ("succeeded", "1")
    assert upstream.seen(path) == 1


def test_a_write_held_for_approval_is_not_sent_at_stop(tmp_path, confdir, upstream, bucket):
    """A held write is not waited for: its receipt becomes not_sent with the reason, its agent gets 503."""
    proxy = Proxy(tmp_path, confdir).start()  # the 30 s drain is not waited out
    path = f"/api/{bucket}/refunds"
    try:
        t, got = in_background(proxy, upstream.url + path, {"amount": 10})
        wait_for(lambda: "awaiting approval" in proxy.log(), what="the write to be held for approval")
        sent = signal_proxy(proxy, signal.SIGTERM)
        t.join(timeout=15)
        assert exit_code(proxy, timeout=10) == 0
        assert time.monotonic() - sent < 15  # not waited for (0.5 s on a quiet machine): not after the 30 s drain
        assert got and got[0].status == 503, got
        answer = got[0].json()
        assert (answer["error"], answer["sent"], answer["state"]) == ("not_sent", False, "not_sent")
    finally:
        proxy.stop()
    [(receipt, _)] = receipts(proxy.db, bucket)
    assert receipt.state == "not_sent"
    assert receipt.error == "not sent: the proxy stopped before an operator decided"
    assert answer["operation_id"] == receipt.operation_id
    assert upstream.seen(path) == 0


def test_mitmweb_drains_too(tmp_path, confdir, upstream, bucket):
    """scripts/run (mitmweb): SIGTERM lets the write in flight end, then mitmweb exits 0."""
    run = ScriptsRun(tmp_path, confdir).start()
    path = f"/api/{bucket}/plain"
    upstream.plan(path, "held")
    got: list[requests.Response] = []
    try:
        t = threading.Thread(
            target=lambda: got.append(
                requests.post(
                    upstream.url + path,
                    json={"title": "via mitmweb"},
                    timeout=30,
                    proxies={"http": run.proxy_url, "https": run.proxy_url},
                )
            )
        )
        t.start()
        wait_for(lambda: upstream.seen(path) == 1, what="the upstream to hold the write")
        assert run.proc is not None
        os.kill(run.proc.pid, signal.SIGTERM)
        wait_for(lambda: STOPPING in run.log() or run.proc.poll() is not None, what="mitmweb to drain")
        assert run.proc.poll() is None, run.log()
        upstream.let_go(path)
        t.join(timeout=15)
        assert got and got[0].status_code == 201
        assert run.proc.wait(timeout=10) == 0
    finally:
        upstream.let_go(path)
        run.stop()
    [(receipt, _)] = receipts(tmp_path / "state" / "receipts.db", bucket)
    assert receipt.state == "succeeded"
