"""
A rules file's own `decisions:` (rules/load_decisions.py `with_file_decisions`): applied to every
operation after the operation's own; each field must be one every operation's fingerprint names,
else the load and `rules check` name the file, the line and the operation. An operation's own
list: tests/intent/test_decisions.py.
"""

from __future__ import annotations

import pytest

from proxy_addon.errors import RulesError
from proxy_addon.intent.decisions import decide
from proxy_addon.rules import check_rules, load_rules

FILE = """\
api: pay
hosts: [api.pay.test]
decisions:
  - deny: {principal: {in: [p_blocked]}}
    reason: this caller may not pay
  - approve: {amount: {">=": 100000}}
operations:
  charges.create:
    match: {method: POST, path: /charges}
    fingerprint: {body: [amount, currency]}
    decisions:
      - allow: {currency: eur}
  refunds.create:
    match: {method: POST, path: /refunds}
    fingerprint: {body: [charge, amount]}
"""


def ops():
    return {op.name: op for op in load_rules(FILE, "pay.yaml").operations}


def test_the_files_decisions_follow_each_operations_own():
    charge, refund = ops()["charges.create"], ops()["refunds.create"]
    assert [(r.decision, r.in_file, r.line) for r in charge.decisions] == [
        ("allow", False, 12),
        ("deny", True, 4),
        ("approve", True, 6),
    ]
    assert [r.decision for r in refund.decisions] == ["deny", "approve"]
    # the operation's own entry first: a large charge in eur is allowed, in usd held
    assert decide(charge.decisions, {"body": {"amount": 200000, "currency": "eur"}}, "p1").decision == "allow"
    held = decide(charge.decisions, {"body": {"amount": 200000, "currency": "usd"}}, "p1")
    assert held.decision == "approve" and held.why.startswith("the file's decisions[1] (line 6): approve when")
    assert decide(refund.decisions, {"body": {"amount": 5}}, "p_blocked").why == (
        "the file's decisions[0] (line 4): deny when principal in ['p_blocked']: this caller may not pay"
    )
    assert decide(refund.decisions, {"body": {"amount": 5}}, "p1").decision == "allow"


def test_a_field_one_operation_does_not_record_is_refused_naming_the_file_line_and_operation():
    text = FILE.replace("fingerprint: {body: [charge, amount]}", "fingerprint: {body: [charge]}")
    with pytest.raises(RulesError) as e:
        load_rules(text, "pay.yaml")
    assert str(e.value) == (
        "pay.yaml:6: decisions[1].approve.amount: 'amount' is not a field the fingerprint of operation "
        "'refunds.create' names; the file's decisions apply to every operation, and 'refunds.create' records "
        "only charge, principal"
    )
    two = text.replace("fingerprint: {body: [amount, currency]}", "fingerprint: {body: [currency]}")
    problems = check_rules(two, "pay.yaml")  # `rules check`: one problem per operation, each named
    assert [(p.line, p.field) for p in problems] == [(6, "decisions[1].approve.amount")] * 2
    assert ["'charges.create'" in problems[0].message, "'refunds.create'" in problems[1].message] == [True, True]


def test_the_files_decisions_are_checked_as_an_operations_are():
    bad = FILE.replace('  - approve: {amount: {">=": 100000}}', '  - approve: {amount: {"=~": 1}}')
    with pytest.raises(RulesError) as e:
        load_rules(bad, "pay.yaml")
    assert str(e.value).startswith("pay.yaml:6: decisions[1].approve.amount.=~: unknown test '=~'")
    not_a_list = FILE.replace(
        "decisions:\n  - deny: {principal: {in: [p_blocked]}}\n    reason: this caller may not pay\n"
        '  - approve: {amount: {">=": 100000}}\n',
        "decisions: {}\n",
        1,
    )
    with pytest.raises(RulesError, match=r"pay.yaml:3: decisions: expected a list of decisions, got a mapping"):
        load_rules(not_a_list, "pay.yaml")


def test_a_tool_endpoint_that_records_no_named_field_refuses_a_file_decision_on_one():
    text = """\
api: tools
hosts: [mcp.test]
mcp: {path: /mcp, tools: from_server}
decisions:
  - deny: {params.arguments.to: {not_ends_with: "@example.com"}}
operations:
  send:
    match: {method: POST, path: /mcp, mcp: {tool: send_mail}}
    fingerprint: {body: [params.arguments.to]}
"""
    with pytest.raises(RulesError) as e:
        load_rules(text, "tools.yaml")
    assert "tools.yaml:5: decisions[0].deny.params.arguments.to:" in str(e.value)
    assert "operation 'from_server'" in str(e.value)
    on_principal = text.replace('params.arguments.to: {not_ends_with: "@example.com"}', "principal: p_x")
    assert [r.in_file for op in load_rules(on_principal, "tools.yaml").operations for r in op.decisions] == [
        True,
        True,
    ]
