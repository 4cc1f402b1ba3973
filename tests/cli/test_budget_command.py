"""`receipts budgets` (cli/budget_command.py): each budget the rules declare, with its use now, as a table and JSON."""

from __future__ import annotations

import json

from proxy_addon.intent.budget_charges import charges_of
from proxy_addon.rules import load_rules_path
from proxy_addon.states import State
from proxy_addon.store import Attempt, Store
from tests.cli.conftest import cli
from tests.conftest import T0, FakeClock

RULES = """
api: pay
hosts: [api.pay.test]
operations:
  charge:
    match: {method: POST, path: /charges}
    fingerprint: {body: [amount]}
    budget:
      - {per: principal, window: 1h, count: 3}
      - {window: 1d, sum: amount, max: 1000}
  refund:
    match: {method: POST, path: /refunds}
    fingerprint: {body: [amount]}
"""


def test_budgets_lists_use_per_budget_and_the_top_principals(tmp_path, capsys):
    rules = tmp_path / "pay.yaml"
    rules.write_text(RULES)
    op = load_rules_path(rules).operations[0]
    db = tmp_path / "r.db"
    store = Store.open(db, clock=FakeClock(T0))
    for n, (who, amount) in enumerate([("alice", 100), ("alice", 200), ("bob", 50), ("alice", 5)]):
        intent = {"body": {"amount": amount}}
        a = Attempt("pay", "charge", "POST", "https://api.pay.test/charges", f"sha256:{n}", intent, who)
        decision = store.begin_attempt(Attempt(**{**a.__dict__, "charges": charges_of(op, intent, who)}))
        if n == 3:  # alice's third write ends rejected: it gives its share back
            store.transition(decision.receipt.operation_id, State.REJECTED, reason="HTTP 400")
    store.close()
    now = T0.replace(minute=20)
    code, out, err = cli(capsys, "--db", str(db), "budgets", "--rules", str(rules), "--json", now=now)
    assert (code, err) == (0, "")
    per_caller, daily = json.loads(out)
    assert (per_caller["budget"], per_caller["per"], per_caller["limit"], per_caller["used"]) == (
        "budget[0]",
        "principal",
        3,
        2,
    )
    assert [(t["principal"], t["used"], t["writes"]) for t in per_caller["top"]] == [("alice", 2, 2), ("bob", 1, 1)]
    assert per_caller["ends_in_seconds"] == 40 * 60 and per_caller["window"] == "1h"
    assert (daily["measure"], daily["sum"], daily["used"], daily["limit"], daily["top"]) == (
        "sum",
        "amount",
        350,
        1000,
        [],
    )

    code, out, _ = cli(capsys, "--db", str(db), "budgets", "--rules", str(rules), "--top", "1", now=now)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["OPERATION", "BUDGET", "LIMIT", "PER", "USED", "WINDOW", "ENDS", "IN"]
    assert "pay charge" in lines[1] and "3 writes / 1h" in lines[1] and "2 (most)" in lines[1] and "40m" in lines[1]
    assert "alice" in lines[2] and "2 (2 writes)" in lines[2] and "bob" not in out
    assert "amount ≤ 1000 / 1d" in lines[3] and "350" in lines[3]


def test_budgets_says_when_the_rules_declare_none(tmp_path, capsys):
    rules = tmp_path / "pay.yaml"
    rules.write_text(RULES.split("    budget:")[0] + RULES.split("max: 1000}\n")[1])
    Store.open(tmp_path / "r.db").close()
    code, out, _ = cli(capsys, "--db", str(tmp_path / "r.db"), "budgets", "--rules", str(rules))
    assert code == 0 and out.startswith("no budgets in the rules")
