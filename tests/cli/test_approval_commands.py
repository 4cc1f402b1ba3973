"""
`receipts pending`, `receipts approve`, `receipts deny` (cli/approval_commands.py), in-process against
a database: the refusals, which write nothing, and what the command says of a decision the proxy
applied, did not act on in time, or that someone else took first. From another process against a
running mitmdump that holds a write: tests/e2e/cli/test_approval_commands.py.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from proxy_addon.gate import instances
from proxy_addon.states import State
from proxy_addon.store import Attempt, Store
from tests.cli.conftest import UNKNOWN_ID, assert_one_line_error, cli, table
from tests.conftest import T0, FakeClock

ROOT = Path(__file__).resolve().parents[2]


PENDING_HEADERS = ["ID", "AGE", "OPERATION", "PROXY", "DECISION", "PRINCIPAL", "FINGERPRINT", "INTENT"]


FP = "sha256:" + "3f2a9c1b0d4e" + "5" * 52


def attempt(n: int, instance: str | None, *, approval: bool = True, fp: str | None = None) -> Attempt:
    return Attempt(
        api="test-api",
        operation="refunds.create",
        method="POST",
        target=f"http://127.0.0.1:9/api/b/refunds?n={n}",
        intent_fingerprint=fp or f"sha256:{n:064x}",
        intent={"body": {"amount": n}},
        principal="hmac:5ca1ab1e",
        instance=instance,
        approval=approval,
    )


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
        return tuple(
            conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall()
            for t in ("receipts", "receipt_events", "approval_decisions")
        )
    finally:
        conn.close()


def test_pending_lists_the_held_writes_with_their_intent(held, capsys):
    path, ids, clock, _, live = held
    code, out, err = cli(capsys, "--db", str(path), "pending", now=clock.now)
    assert (code, err) == (0, "")
    rows = table(out, PENDING_HEADERS)
    assert [r["ID"] for r in rows] == [ids["orphan"], ids["held_2"], ids["held"]]  # newest first; not the submitted
    assert rows[2] == {
        "ID": ids["held"],
        "AGE": "1m",
        "OPERATION": "test-api/refunds.create",
        "PROXY": f"pid:{live.split('-')[0]}",
        "DECISION": "-",
        "PRINCIPAL": "hmac:5ca1ab1e",
        "FINGERPRINT": "sha256:3f2a9c1b0d4e",
        "INTENT": '{"body":{"amount":1}}',
    }
    assert rows[0]["PROXY"] == "stopped"


def test_pending_json_and_a_decision_not_applied_yet(held, capsys):
    path, ids, clock, _, live = held
    assert cli(capsys, "--db", str(path), "approve", ids["held"], "--note", "ok", "--wait", "0", now=clock.now)[0] == 0
    code, out, _ = cli(capsys, "--db", str(path), "pending", "--json", now=clock.now)
    assert code == 0
    data = {d["operation_id"]: d for d in json.loads(out)}
    assert set(data) == {ids["held"], ids["held_2"], ids["orphan"]}
    assert data[ids["held"]]["decision"] == {
        "decision": "approved",
        "note": "ok",
        "actor": "cli:alice",
        "decided_at": "2026-03-01T12:01:30.000000Z",
    }
    assert (data[ids["held"]]["held_by"], data[ids["orphan"]]["held_by"]) == (f"pid:{live.split('-')[0]}", None)
    assert (data[ids["held"]]["intent_fingerprint"], data[ids["held"]]["state"]) == (FP, "awaiting_approval")
    _, out, _ = cli(capsys, "--db", str(path), "pending", now=clock.now)
    assert {r["ID"]: r["DECISION"] for r in table(out, PENDING_HEADERS)}[ids["held"]] == "approved"


def test_pending_with_nothing_held(tmp_path, capsys):
    Store.open(tmp_path / "r.db").close()
    assert cli(capsys, "--db", str(tmp_path / "r.db"), "pending") == (
        0,
        f"no writes awaiting approval in {tmp_path / 'r.db'}\n",
        "",
    )


@pytest.mark.parametrize(
    ("which", "needles"),
    [
        ("submitted", ["is submitted, not awaiting_approval", "only a write held for approval"]),
        ("orphan", ["is not held: the proxy that held it (instance 99999-0badcafe) has stopped", "not_sent"]),
        ("unknown", [f"no receipt {UNKNOWN_ID}"]),
    ],
)
@pytest.mark.parametrize("command", ["approve", "deny"])
def test_deciding_a_write_that_is_not_held_is_refused(held, capsys, which, needles, command):
    path, ids, clock, _, _ = held
    before = everything(path)
    code, out, err = cli(capsys, "--db", str(path), command, ids.get(which, UNKNOWN_ID), "--note", "n", now=clock.now)
    assert_one_line_error(code, out, err, *needles)
    assert everything(path) == before


def test_a_held_write_is_decided_once(held, capsys):
    path, ids, clock, _, _ = held
    code, out, err = cli(capsys, "--db", str(path), "approve", ids["held"], "--wait", "0", now=clock.now)
    assert (code, out, err) == (0, f"{ids['held']} approved by cli:alice: recorded for the proxy that holds it\n", "")
    before = everything(path)
    for command in ("approve", "deny"):
        code, out, err = cli(capsys, "--db", str(path), command, ids["held"], "--note", "again", now=clock.now)
        assert_one_line_error(
            code,
            out,
            err,
            f"receipt {ids['held']} was already approved by cli:alice at "
            "2026-03-01T12:01:30.000000Z: a held write is decided once",
        )
    assert everything(path) == before


def test_a_decision_binds_to_the_fingerprint_the_operator_saw(held, capsys):
    path, ids, clock, store, _ = held
    before = everything(path)
    code, out, err = cli(
        capsys, "--db", str(path), "approve", ids["held"], "--fingerprint", "sha256:00000000", now=clock.now
    )
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


def later(seconds: float, fn) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        fn()

    t = threading.Thread(target=run)
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
        s.transition(
            ids["held"],
            State.SUBMITTED,
            reason="approved by operator",
            actor="mitmweb operator",
            expect=[State.AWAITING_APPROVAL],
        )
        s.close()

    t = later(0.3, mitmweb)
    code, out, err = cli(capsys, "--db", str(path), "deny", ids["held"], "--note", "no", now=clock.now)
    t.join()
    assert_one_line_error(
        code,
        out,
        err,
        f"receipt {ids['held']} was decided otherwise before the proxy applied "
        "yours: submitted by mitmweb operator (approved by operator); your "
        "decision (denied) was not used",
    )


def test_the_command_says_when_the_proxy_did_not_act_in_time(held, capsys):
    path, ids, clock, store, _ = held
    started = time.monotonic()
    code, out, err = cli(capsys, "--db", str(path), "approve", ids["held"], "--wait", "0.3", now=clock.now)
    assert 0.3 <= time.monotonic() - started < 4.5  # 0.35 s on a quiet machine; --wait ignored: its default, 5 s
    assert_one_line_error(
        code, out, err, "approved by cli:alice is recorded, but the proxy that holds it has not applied it within 0.3s"
    )
    assert store.approval_decision(ids["held"]).consumed_at is None  # recorded: the proxy may still apply it
