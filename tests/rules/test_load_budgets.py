"""An operation's `budget:` loaded (rules/load_budgets.py): its forms, and each mistake named by line and field."""

from __future__ import annotations

import pytest

from proxy_addon.errors import RulesError
from proxy_addon.rules import load_rules
from proxy_addon.rules.model import Budget, window_text

HEAD = (
    "api: pay\nhosts: [api.pay.test]\noperations:\n  charge:\n    match: {method: POST, path: /charges}\n"
    "    fingerprint: {body: [amount, to]}\n"
)


def budgets(text: str) -> tuple[Budget, ...]:
    return load_rules(HEAD + text, "pay.yaml").operations[0].budgets


def problem(text: str) -> RulesError:
    with pytest.raises(RulesError) as e:
        budgets(text)
    return e.value


def test_one_mapping_per_principal_counted():
    [b] = budgets("    budget: {per: principal, window: 1h, count: 20}\n")
    assert (b.per, b.window, b.limit, b.sum, b.index) == ("principal", 3600, 20, None, 0)
    assert b.describe() == "budget[0]: 20 writes per 1h per principal"


def test_a_list_each_with_its_place_and_the_default_per_operation():
    first, second = budgets(
        "    budget:\n      - {window: 90s, count: 3}\n      - {window: 1d, sum: amount, max: 500000}\n"
    )
    assert (first.per, first.window, first.index) == ("operation", 90, 0)
    assert (second.sum, second.limit, second.window, second.index) == ("amount", 500000, 86400, 1)
    assert second.describe() == "budget[1]: amount at most 500000 per 1d"
    assert second.line == 9


@pytest.mark.parametrize(
    "text, field, words",
    [
        ("{window: 1h}", "budget", "exactly one of count"),
        ("{window: 1h, count: 2, sum: amount, max: 3}", "budget", "exactly one of count"),
        ("{window: 1h, count: 0}", "budget.count", "at least 1"),
        ("{window: 1h, count: 2.5}", "budget.count", "whole number"),
        ("{window: 1h, count: 2, max: 3}", "budget.max", "goes with sum"),
        ("{window: 1h, sum: amount}", "budget.max", "is required with sum"),
        ("{window: 1h, sum: amount, max: 0}", "budget.max", "above 0"),
        ("{window: 1h, sum: amount, max: lots}", "budget.max", "expected a number"),
        ("{window: 1h, sum: total, max: 3}", "budget.sum", "'total' is not a field the fingerprint names"),
        ("{window: 1h, sum: principal, max: 3}", "budget.sum", "is not a field the fingerprint names"),
        ("{window: soon, count: 2}", "budget.window", "duration"),
        ("{window: 0s, count: 2}", "budget.window", "1s to 366d"),
        ("{count: 2}", "budget.window", "required"),
        ("{window: 1h, count: 2, per: caller}", "budget.per", "operation, principal"),
        ("{window: 1h, count: 2, every: 1}", "budget.every", "unknown key"),
        ("[]", "budget", "empty list"),
    ],
)
def test_mistakes_name_their_field(text, field, words):
    e = problem(f"    budget: {text}\n")
    assert e.field == f"operations.charge.{field}" and words in e.message, (e.field, e.message)
    assert e.line == 7 or (field == "budget.window" and "required" in words)


def test_in_a_list_the_item_is_named():
    e = problem("    budget:\n      - {window: 1h, count: 2}\n      - {window: 1h, count: -1}\n")
    assert e.field == "operations.charge.budget[1].count"


def test_window_text_writes_the_largest_unit():
    assert [window_text(s) for s in (86400, 7200, 120, 90, 1)] == ["1d", "2h", "2m", "90s", "1s"]
