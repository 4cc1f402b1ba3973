"""What a write takes of its budgets (intent/budget_charges.py), and what cannot be counted."""

from __future__ import annotations

import pytest

from proxy_addon.errors import UncountableWrite
from proxy_addon.intent.budget_charges import budget_key, charges_of
from proxy_addon.rules import load_rules

RULES = """
api: pay
hosts: [api.pay.test]
operations:
  charge:
    match: {method: POST, path: /charges}
    fingerprint: {body: [amount, to]}
    budget:
      - {per: principal, window: 1h, count: 20}
      - {window: 1d, sum: amount, max: 500000}
"""
OP = load_rules(RULES, "pay.yaml").operations[0]


def test_a_count_takes_one_and_a_sum_takes_its_field_per_principal_or_not():
    per_caller, daily = charges_of(OP, {"body": {"amount": 1250, "to": "x"}}, "p1")
    assert (per_caller.amount, per_caller.limit, per_caller.window, per_caller.principal) == (1, 20, 3600, "p1")
    assert per_caller.key == "pay/charge/budget[0]/3600s/count" == budget_key(OP, OP.budgets[0])
    assert (daily.amount, daily.limit, daily.principal, daily.key) == (
        1250,
        500000,
        "",
        "pay/charge/budget[1]/86400s/sum:amount",
    )
    assert daily.what == "pay charge budget[1]: amount at most 500000 per 1d"
    assert per_caller.lock != charges_of(OP, {"body": {"amount": 1}}, "p2")[0].lock  # one lock per caller
    assert daily.lock == charges_of(OP, {"body": {"amount": 1}}, "p2")[1].lock  # one for the operation


@pytest.mark.parametrize(
    "intent, amount",
    [
        ({"body": {"amount": 12.5}}, 12.5),
        ({"form": {"amount": "1500"}}, 1500),  # a form carries numbers as text
        ({"form": {"amount": "12.50"}}, 12.5),
        ({"multipart": {"amount": "7"}}, 7),
        ({"body": {"amount": 0}}, 0),
    ],
)
def test_a_summed_field_is_a_number_or_decimal_text(intent, amount):
    assert charges_of(OP, intent, "p1")[1].amount == amount


@pytest.mark.parametrize(
    "intent, words",
    [
        ({"body": {"to": "x"}}, "has no such field"),
        ({"body": {"amount": None}, "missing": ["amount"]}, "has no such field"),
        ({"body": {"amount": "lots"}}, "not a number"),
        ({"body": {"amount": "1e5"}}, "not a number"),
        ({"body": {"amount": True}}, "not a number"),
        ({"body": {"amount": "hmac:0123abcd"}, "hashed": ["amount"]}, "keyed hash"),
        ({"body": {"amount": -5}}, "0 or more"),
        ({"body": {"amount": ["1"]}}, "not a number"),
    ],
)
def test_a_write_that_cannot_be_counted_is_refused_naming_the_field_never_its_value(intent, words):
    with pytest.raises(UncountableWrite) as e:
        charges_of(OP, intent, "p1")
    text = str(e.value)
    assert "'amount'" in text and words in text and "budget[1]" in text
    assert "lots" not in text and "hmac:" not in text
