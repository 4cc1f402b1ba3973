"""Decisions on the intent (intent/decisions.py) and their loading (rules/load_decisions.py)."""

from __future__ import annotations

import pytest

from proxy_addon.errors import RulesError
from proxy_addon.intent.decisions import decide
from proxy_addon.rules import load_rules

HEAD = "api: pay\nhosts: [api.pay.test]\noperations:\n  charge:\n    match: {method: POST, path: /charges}\n"


def op_with(decisions: str, fields: str = "[amount, to, currency]"):
    text = HEAD + f"    fingerprint: {{body: {fields}}}\n    decisions:\n" + decisions
    return load_rules(text, "pay.yaml").operations[0]


BAND = (
    '      - deny: {to: {not_ends_with: "@example.com"}}\n'
    "        reason: mail leaves the company\n"
    '      - approve: {amount: {">=": 100000}}\n'
    '      - allow: {amount: {">=": 0, "<": 100000}, currency: {in: [eur, usd]}}\n'
)


def verdict(op, **body):
    return decide(op.decisions, {"body": body}, "p1")


def test_first_matching_decision_wins_and_the_default_is_allow():
    op = op_with(BAND)
    assert verdict(op, amount=100000, to="a@example.com", currency="eur").decision == "approve"
    assert verdict(op, amount=99999, to="a@example.com", currency="eur").decision == "allow"
    denied = verdict(op, amount=5, to="a@evil.test", currency="eur")
    assert denied.decision == "deny"
    assert "decisions[0]" in denied.why and "mail leaves the company" in denied.why
    assert verdict(op, amount=5, to="a@EXAMPLE.com", currency="gbp").decision == "allow"  # default


def test_missing_null_or_other_typed_values_pass_no_test():
    op = op_with('      - approve: {amount: {">=": 100}}\n      - deny: {to: {not_in: [x]}}\n')
    assert verdict(op, amount="1000").decision == "allow"  # a string is not a number
    assert verdict(op, amount=True).decision == "allow"
    assert verdict(op, amount=None, to=None).decision == "allow"
    assert decide(op.decisions, {"fallback": "no_named_field"}, "p").decision == "allow"


def test_equality_regex_and_principal():
    op = op_with('      - deny: {principal: p1, currency: {matches: "^x"}}\n      - approve: {currency: usd}\n')
    assert verdict(op, currency="xau").decision == "deny"
    assert decide(op.decisions, {"body": {"currency": "xau"}}, "p2").decision == "allow"
    assert verdict(op, currency="usd").decision == "approve"


@pytest.mark.parametrize(
    ("decisions", "field", "said"),
    [
        ("      - deny: {iban: x}\n", "operations.charge.decisions[0].deny.iban", "not a field the fingerprint names"),
        ('      - deny: {amount: {"=~": 3}}\n', "operations.charge.decisions[0].deny.amount.=~", "unknown test"),
        ("      - deny: {amount: {in: 3}}\n", "operations.charge.decisions[0].deny.amount.in", "a list"),
        ('      - deny: {to: {matches: "("}}\n', "operations.charge.decisions[0].deny.to.matches", "regular"),
        ('      - deny: {amount: {">": [1]}}\n', "operations.charge.decisions[0].deny.amount.>", "a value"),
        ("      - {deny: {amount: 1}, allow: {amount: 2}}\n", "operations.charge.decisions[0]", "exactly one"),
        ("      - hold: {amount: 1}\n", "operations.charge.decisions[0].hold", "unknown key"),
    ],
)
def test_loader_errors_name_file_line_and_field(decisions, field, said):
    with pytest.raises(RulesError) as e:
        op_with(decisions)
    text = str(e.value)
    assert "pay.yaml" in text and field in text and said in text
    assert text.startswith("pay.yaml:8:")  # the line of the decision


def test_a_list_passes_a_test_when_every_item_does_and_a_negated_test_when_any_fails():
    op = op_with(BAND)
    # one outside address among company ones: denied (before this, a list passed no test and was allowed)
    assert verdict(op, amount=5, to=["a@example.com", "b@evil.test"], currency="eur").decision == "deny"
    assert verdict(op, amount=5, to=["a@example.com", "b@EXAMPLE.com"], currency="eur").decision == "allow"
    assert verdict(op, amount=5, to=[], currency="eur").decision == "allow"  # empty: no test holds, deny too
    allow_in = op_with('      - allow: {currency: {in: [eur, usd]}}\n      - deny: {currency: {"!=": x}}\n')
    assert verdict(allow_in, currency=["eur", "usd"]).decision == "allow"
    assert verdict(allow_in, currency=["eur", "gbp"]).decision == "deny"
    assert verdict(allow_in, currency=[{"a": 1}]).decision == "deny"  # an object item fails `==`, so `!=` holds


def test_a_form_bodys_decimal_text_compares_with_a_number():
    """Stripe's form bodies carry `amount=150000` as text: a band on amount reads it as the number it is."""
    from proxy_addon.intent.fingerprint import RequestView, build_attempt
    from proxy_addon.rules import RuleSet

    text = (
        "api: pay\nhosts: [api.pay.test]\noperations:\n  charge:\n    match: {method: POST, path: /charges}\n"
        "    fingerprint: {body: [amount, currency]}\n    decisions:\n"
        '      - approve: {amount: {">=": 100000}}\n      - deny: {currency: {not_in: [eur, usd]}}\n'
    )
    rules = RuleSet.of([load_rules(text, "pay.yaml")])

    def decided(body: bytes) -> tuple[bool, str | None]:
        req = RequestView(
            "POST",
            "https",
            "api.pay.test",
            443,
            "/charges",
            {"content-type": "application/x-www-form-urlencoded"},
            body,
        )
        m = rules.match(req.host, req.port, req.method, req.path, body, list(req.headers.items()))
        assert m is not None
        a = build_attempt(m, req, b"k" * 32)
        assert "form" in a.intent  # the form's fields, where decisions read them
        return a.approval, a.denied

    assert decided(b"amount=150000&currency=eur") == (True, None)  # before: text never >= a number: allowed
    assert decided(b"amount=99999&currency=eur") == (False, None)
    assert decided(b"amount=12.5&currency=usd") == (False, None)
    assert decided(b"amount=lots&currency=eur") == (False, None)  # not a number: no test holds
    assert decided(b"amount=5&currency=gbp")[1] is not None  # text tests still read text
    op = op_with('      - allow: {currency: {"==": "100"}}\n      - deny: {currency: {"!=": "x"}}\n')
    assert decide(op.decisions, {"form": {"currency": "100"}}, "p1").decision == "allow"  # text with text
