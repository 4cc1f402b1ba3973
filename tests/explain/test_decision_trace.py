"""
`receipts rules explain` shows which decision a request gets, and why (explain/decision_trace.py):
the entries tried in order, each with its line, the value each test read and whether it held, up to
the one that decided; the file's own decisions after the operation's. Through the CLI too.
"""

from __future__ import annotations

import json

from proxy_addon import cli
from proxy_addon.explain import explain, render
from proxy_addon.rules import RuleSet, load_rules

RULES = """\
api: pay
hosts: [api.pay.test]
decisions:
  - deny: {to: {not_ends_with: "@example.com"}}
    reason: mail leaves the company
operations:
  charges.create:
    match: {method: POST, path: /charges}
    fingerprint: {body: [amount, to]}
    decisions:
      - approve: {amount: {">=": 100000}}
        reason: large charges need a person
      - allow: {amount: {">=": 100, "<": 100000}}
"""
PLAIN = """\
api: plain
hosts: [api.plain.test]
operations:
  plain.create:
    match: {method: POST, path: /plain}
    fingerprint: {body: [title]}
"""
URL = "https://api.pay.test/charges"
KEY = b"k" * 32


def report(body: dict, url: str = URL, text: str = RULES) -> dict:
    rules = RuleSet.of([load_rules(text, "pay.yaml")])
    return explain(rules, "POST", url, json.dumps(body).encode(), {"content-type": "application/json"}, KEY)


def test_both_ends_of_a_band_each_entry_tried_with_its_line_and_values():
    held = report({"amount": 100000, "to": "a@example.com"})["decision"]
    assert held["decision"] == "approve"
    assert held["why"] == "decisions[0] (line 11): approve when amount >= 100000: large charges need a person"
    assert held["tried"] == [
        {
            "entry": "decisions[0]",
            "line": 11,
            "decision": "approve",
            "held": True,
            "tests": [{"field": "amount", "value": 100000, "missing": False, "test": ">= 100000", "holds": True}],
        }
    ]
    below = report({"amount": 99999, "to": "a@example.com"})["decision"]
    assert below["decision"] == "allow" and [t["held"] for t in below["tried"]] == [False, True]
    assert [(t["test"], t["holds"]) for t in below["tried"][1]["tests"]] == [(">= 100", True), ("< 100000", True)]


def test_a_deny_from_the_files_decisions_and_a_missing_field_as_the_text_shows_them():
    r = report({"amount": 5, "to": "x@elsewhere.test"})
    assert r["decision"]["decision"] == "deny"
    assert [(t["entry"], t["line"], t["held"]) for t in r["decision"]["tried"]] == [
        ("decisions[0]", 11, False),
        ("decisions[1]", 13, False),
        ("the file's decisions[0]", 4, True),
    ]
    text = render(r)
    assert (
        "\ndecision: deny: answered 403 denied_by_policy and recorded rejected: nothing is sent\n"
        "  the file's decisions[0] (line 4): deny when to not_ends_with '@example.com': mail leaves the company\n"
        "  decisions[0] (line 11) approve: does not hold\n"
        "    amount = 5: >= 100000 fails\n"
        "  decisions[1] (line 13) allow: does not hold\n"
        "    amount = 5: >= 100 fails\n"  # below the band's lower end
        "    amount = 5: < 100000 holds\n"
        "  the file's decisions[0] (line 4) deny: holds: it decides\n"
        "    to = \"x@elsewhere.test\": not_ends_with '@example.com' holds\n"
    ) in text
    missing = report({"amount": 5})["decision"]
    assert missing["decision"] == "allow" and missing["why"] == "no decision matched (the default is allow)"
    assert missing["tried"][2]["tests"][0] == {
        "field": "to",
        "value": None,
        "missing": True,
        "test": "not_ends_with '@example.com'",
        "holds": False,
    }
    shown = render(report({"amount": 5}))
    assert "    to = missing or null (passes no test): not_ends_with '@example.com' fails\n" in shown


def test_an_operation_without_decisions_shows_none():
    r = report({"title": "t"}, "https://api.plain.test/plain", PLAIN)
    assert "decision" not in r and "\ndecision:" not in render(r)


def test_through_the_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RECEIPT_PROXY_STATE_DIR", str(tmp_path / "state"))  # no receipts DB, no key
    rules = tmp_path / "pay.yaml"
    rules.write_text(RULES)
    body = tmp_path / "charge.json"
    body.write_text(json.dumps({"amount": 250000, "to": "b@example.com"}))
    assert cli.main(["rules", "explain", "POST", URL, "--body", str(body), "--rules", str(rules)]) == 0
    out = capsys.readouterr().out
    assert "decision: approve: held for an operator's approval (mitmweb, receipts approve) before it is sent\n" in out
    assert "    amount = 250000: >= 100000 holds\n" in out
