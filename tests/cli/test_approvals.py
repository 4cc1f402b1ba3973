"""
`receipts pending`, `receipts approve`, `receipts deny`: in-process against a database (the
refusals, which write nothing), and from another process against a running mitmdump that
holds a write (the decision applied within a second, one write or none upstream).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from proxy_addon.gate import instances
from proxy_addon.states import State
from proxy_addon.store import Attempt, Store
from tests.cli.conftest import UNKNOWN_ID, assert_one_line_error, cli, table
from tests.conftest import T0, FakeClock, Proxy, wait_for

ROOT = Path(__file__).resolve().parents[2]
PENDING_HEADERS = ["ID", "AGE", "OPERATION", "PROXY", "DECISION", "PRINCIPAL", "FINGERPRINT", "INTENT"]
FP = "sha256:" + "3f2a9c1b0d4e" + "5" * 52


def attempt(n: int, instance: str | None, *, approval: bool = True, fp: str | None = None) -> Attempt:
    return Attempt(api="test-api", operation="refunds.create", method="POST",
                   target=f"http://127.0.0.1:9/api/b/refunds?n={n}", intent_fingerprint=fp or f"sha256:{n:064x}",
                   intent={"body": {"amount": n}}, principal="hmac:5ca1ab1e", instance=instance, approval=approval)


@pytest.fixture
def held(tmp_path, alice):
    """
    Two writes held by a running proxy (this test process holds the instance's lock, as a
    proxy does), one held by a proxy that has stopped, and a submitted receipt; now is T0+90s.
    """
    path = tmp_path / "receipts.db"
    clock = FakeClock()
    store = Store.open(path, clock=clock)
    live, fd = instances.claim(path)
    ids = {"held": store.begin_attempt(attempt(1, live, fp=FP)).receipt.operation_id}
    clock.advance(30)
    ids["held_2"] = store.begin_attempt(attempt(2, live)).receipt.operation_id
    ids["orphan"] = store.begin_attempt(attempt(3, "99999-0badcafe")).receipt.operation_id
    ids["submitted"] = store.begin_attempt(attempt(4, live, approval=False)).receipt.operation_id
    clock.now = T0 + dt.timedelta(seconds=90)
    yield path, ids, clock, store, live
    store.close()
    os.close(fd)


def everything(path: Path) -> tuple[list, ...]:
    """Every table the commands could write: to show that a refusal wrote nothing."""
    conn = sqlite3.connect(path)
    try:
        return tuple(conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall()
                     for t in ("receipts", "receipt_events", "approval_decisions"))
    finally:
        conn.close()


# --- pending ---------------------------------------------------------------------------------


def test_pending_lists_the_held_writes_with_their_intent(held, capsys):
    path, ids, clock, _, live = held
    code, out, err = cli(capsys, "--db", str(path), "pending", now=clock.now)
    assert (code, err) == (0, "")
    rows = table(out, PENDING_HEADERS)
    assert [r["ID"] for r in rows] == [ids["orphan"], ids["held_2"], ids["held"]]  # newest first; not the submitted
    assert rows[2] == {"ID": ids["held"], "AGE": "1m", "OPERATION": "test-api/refunds.create",
                       "PROXY": f"pid:{live.split('-')[0]}", "DECISION": "-", "PRINCIPAL": "hmac:5ca1ab1e",
                       "FINGERPRINT": "sha256:3f2a9c1b0d4e", "INTENT": '{"body":{"amount":1}}'}
    assert rows[0]["PROXY"] == "stopped"


def test_pending_json_and_a_decision_not_applied_yet(held, capsys):
    path, ids, clock, _, live = held
    assert cli(capsys, "--db", str(path), "approve", ids["held"], "--note", "ok", "--wait", "0", now=clock.now)[0] == 0
    code, out, _ = cli(capsys, "--db", str(path), "pending", "--json", now=clock.now)
    assert code == 0
    data = {d["operation_id"]: d for d in json.loads(out)}
    assert set(data) == {ids["held"], ids["held_2"], ids["orphan"]}
    assert data[ids["held"]]["decision"] == {"decision": "approved", "note": "ok", "actor": "cli:alice",
                                             "decided_at": "2026-03-01T12:01:30.000000Z"}
    assert (data[ids["held"]]["held_by"], data[ids["orphan"]]["held_by"]) == (f"pid:{live.split('-')[0]}", None)
    assert (data[ids["held"]]["intent_fingerprint"], data[ids["held"]]["state"]) == (FP, "awaiting_approval")
    _, out, _ = cli(capsys, "--db", str(path), "pending", now=clock.now)
    assert {r["ID"]: r["DECISION"] for r in table(out, PENDING_HEADERS)}[ids["held"]] == "approved"


def test_pending_with_nothing_held(tmp_path, capsys):
    Store.open(tmp_path / "r.db").close()
    assert cli(capsys, "--db", str(tmp_path / "r.db"), "pending") == (
        0, f"no writes awaiting approval in {tmp_path / 'r.db'}\n", "")


# --- approve / deny: refused, writing nothing --------------------------------------------------


@pytest.mark.parametrize(("which", "needles"), [
    ("submitted", ["is submitted, not awaiting_approval", "only a write held for approval"]),
    ("orphan", ["is not held: the proxy that held it (instance 99999-0badcafe) has stopped", "not_sent"]),
    ("unknown", [f"no receipt {UNKNOWN_ID}"]),
])
@pytest.mark.parametrize("command", ["approve", "deny"])
def test_deciding_a_write_that_is_not_held_is_refused(held, capsys, which, needles, command):
    path, ids, clock, _, _ = held
    before = everything(path)
    code, out, err = cli(capsys, "--db", str(path), command, ids.get(which, UNKNOWN_ID), "--note", "n",
                         now=clock.now)
    assert_one_line_error(code, out, err, *needles)
    assert everything(path) == before


def test_a_held_write_is_decided_once(held, capsys):
    path, ids, clock, _, _ = held
    code, out, err = cli(capsys, "--db", str(path), "approve", ids["held"], "--wait", "0", now=clock.now)
    assert (code, out, err) == (0, f"{ids['held']} approved by cli:alice: recorded for the proxy that holds it\n", "")
    before = everything(path)
    for command in ("approve", "deny"):
        code, out, err = cli(capsys, "--db", str(path), command, ids["held"], "--note", "again", now=clock.now)
        assert_one_line_error(code, out, err, f"receipt {ids['held']} was already approved by cli:alice at "
                                              "2026-03-01T12:01:30.000000Z: a held write is decided once")
    assert everything(path) == before


def test_a_decision_binds_to_the_fingerprint_the_operator_saw(held, capsys):
    path, ids, clock, store, _ = held
    before = everything(path)
    code, out, err = cli(capsys, "--db", str(path), "approve", ids["held"], "--fingerprint", "sha256:00000000",
                         now=clock.now)
    assert_one_line_error(code, out, err, f"has the intent fingerprint {FP}, not sha256:00000000...")
    for bad in ("3f2a9c", "sha256:xyzxyzxyz", "md5:3f2a9c1b0d4e"):
        code, out, err = cli(capsys, "--db", str(path), "approve", ids["held"], "--fingerprint", bad)
        assert_one_line_error(code, out, err, "--fingerprint", "at least 8 hex digits")
    assert everything(path) == before
    code, _, _ = cli(capsys, "--db", str(path), "approve", ids["held"], "--fingerprint", "3F2A9C1B0D4E", "--wait", "0")
    assert code == 0 and store.approval_decision(ids["held"]).intent_fingerprint == FP


def test_a_denial_needs_a_note(held, capsys):
    path, ids, _, _, _ = held
    before = everything(path)
    with pytest.raises(SystemExit) as e:
        cli(capsys, "--db", str(path), "deny", ids["held"])
    assert e.value.code == 2 and "--note" in capsys.readouterr().err
    code, out, err = cli(capsys, "--db", str(path), "deny", ids["held"], "--note", "   ")
    assert_one_line_error(code, out, err, "--note must say why the write is denied")
    assert everything(path) == before


# --- approve / deny: waiting for the proxy ---------------------------------------------------------


def later(seconds: float, fn) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(seconds), fn()))
    t.start()
    return t


def test_the_command_says_when_the_proxy_applied_the_decision(held, capsys):
    """What the proxy does (apply_approval from its own connection) while the command waits."""
    path, ids, clock, _, _ = held

    def proxy():
        s = Store.open(path)
        d = s.approval_decisions([ids["held"]])[ids["held"]]
        s.apply_approval(d, fingerprint=FP, reason="denied by operator: too much")
        s.close()

    t = later(0.3, proxy)
    code, out, err = cli(capsys, "--db", str(path), "deny", ids["held"], "--note", "too much", now=clock.now)
    t.join()
    assert (code, err) == (0, "")
    assert out == f"{ids['held']} is now rejected (was awaiting_approval): denied by cli:alice: too much\n"


def test_the_command_says_when_someone_else_decided_first(held, capsys):
    """mitmweb's Resume (or the timeout) moved the receipt before the proxy took this decision: exit 1."""
    path, ids, clock, _, _ = held

    def mitmweb():
        s = Store.open(path)
        s.transition(ids["held"], State.SUBMITTED, reason="approved by operator", actor="mitmweb operator",
                     expect=[State.AWAITING_APPROVAL])
        s.close()

    t = later(0.3, mitmweb)
    code, out, err = cli(capsys, "--db", str(path), "deny", ids["held"], "--note", "no", now=clock.now)
    t.join()
    assert_one_line_error(code, out, err, f"receipt {ids['held']} was decided otherwise before the proxy applied "
                                          "yours: submitted by mitmweb operator (approved by operator); your "
                                          "decision (denied) was not used")


def test_the_command_says_when_the_proxy_did_not_act_in_time(held, capsys):
    path, ids, clock, store, _ = held
    started = time.monotonic()
    code, out, err = cli(capsys, "--db", str(path), "approve", ids["held"], "--wait", "0.3", now=clock.now)
    assert 0.3 <= time.monotonic() - started < 2
    assert_one_line_error(code, out, err, "approved by cli:alice is recorded, but the proxy that holds it has not "
                                          "applied it within 0.3s")
    assert store.approval_decision(ids["held"]).consumed_at is None  # recorded: the proxy may still apply it


# --- from another process, against a running proxy -------------------------------------------------


def receipts(db: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a process of its own, as an operator runs it (this checkout's code)."""
    return subprocess.run([sys.executable, "-m", "proxy_addon.cli", "--db", str(db), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=30, env={**os.environ, "LOGNAME": "carol"})


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
            got.append(requests.post(url, json={"amount": amount}, timeout=30,
                                     proxies={"http": proxy.url, "https": proxy.url}))
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
        f"pid:{proxy_holding.proc.pid}", "test-api/refunds.create", "-",
        f'{{"body":{{"amount":10}},"path":{{"bucket":"{bucket}"}}}}')
    refused = receipts(proxy_holding.db, "approve", rid, "--fingerprint", "sha256:00000000")
    assert (refused.returncode, refused.stdout) == (1, "") and "not the write you meant" in refused.stderr
    assert upstream.seen(path) == 0  # still held

    started = time.monotonic()
    approved = receipts(proxy_holding.db, "approve", rid, "--note", "refund agreed",
                        "--fingerprint", row["FINGERPRINT"])
    wait_for(lambda: upstream.commits(path) == 1, timeout=5, what="the approved write upstream")
    took = time.monotonic() - started
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.startswith(f"{rid} is now ") and approved.stdout.endswith(
        "(was awaiting_approval): approved by cli:carol: refund agreed\n")
    agent.join(timeout=30)
    (answer,) = got
    assert (answer.status_code, answer.headers["x-receipt-id"]) == (201, rid)
    assert took < 3, f"the write went upstream {took:.2f}s after `receipts approve` started"
    assert upstream.seen(path) == upstream.commits(path) == 1

    again = receipts(proxy_holding.db, "approve", rid)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr == (f"Error: receipt {rid} is succeeded, not awaiting_approval: only a write held for "
                            "approval can be approved or denied\n")
    s = Store.open(proxy_holding.db, create=False)
    ev = [e for e in s.events(rid) if e.from_state == "awaiting_approval"]
    assert [(e.to_state, e.actor, e.reason) for e in ev] == [
        ("submitted", "cli:carol", "approved by operator: refund agreed")]
    assert s.get(rid).state == "succeeded" and s.approval_decision(rid).consumed_at is not None
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
        "error": "denied_by_operator", "operation_id": rid, "reason": "denied by operator: amount too high",
        "sent": False}
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
        assert refused.returncode == 1 and "has stopped; nothing was sent, and the next proxy start records it " \
                                           "not_sent" in refused.stderr
        assert everything(proxy.db) == before
        proxy.start()  # recovery
        s = Store.open(proxy.db, create=False)
        r = s.get(rid)
        s.close()
        assert (r.state, r.error) == ("not_sent", "proxy stopped while the request awaited approval")
        assert upstream.seen(path) == 0
    finally:
        proxy.stop()
