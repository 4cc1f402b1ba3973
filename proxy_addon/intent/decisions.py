"""
Deciding on a write by what its intent says (`decisions:` of its operation, rules/load_decisions.py).

    verdict = decide(op.decisions, intent, principal)   # Verdict("approve", "decisions[0]: amount >= 100000 ...")

The conditions read the intent as the receipt records it: the fingerprint's named fields (body,
path, query, headers, an MCP call's arguments) and the principal. The first entry whose
conditions all hold decides; with none, the write is allowed. A field the intent lacks (a missing
body field, a body hashed whole) or holds null fails every test, `!=` and `not_in` too; a list
passes when every item does (a negated test: when any item fails; `holds`). To refuse
what a decision cannot read, end the list with an unconditional-looking catch (a `deny` on
`principal: {matches: "."}`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy_addon.rules.model import PRINCIPAL, Condition, DecisionRule, same_value

SECTIONS = ("body", "form", "multipart", "arguments", "path", "query", "headers")  # where the intent keeps named fields
TEXT_SECTIONS = ("form", "multipart")  # every value is text there: a decimal one compares with a number
DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")


class FormText(str):
    """A form or multipart field's value: text that stands for a number where a test compares it with one."""


MISSING = object()


@dataclass(frozen=True)
class Verdict:
    decision: str  # allow, approve or deny
    why: str  # which entry decided and on what, or that none did


def decide(rules: Sequence[DecisionRule], intent: Mapping[str, Any], principal: str) -> Verdict:
    """The first entry whose conditions all hold; `allow` when none does."""
    for rule in rules:
        if all(holds(c, value_of(c.field, intent, principal)) for c in rule.conditions):
            return Verdict(rule.decision, describe(rule))
    return Verdict("allow", "no decision matched (the default is allow)" if rules else "the operation has no decisions")


@dataclass(frozen=True)
class Tried:
    """One entry as `trace` tried it: each test with the value it read (MISSING: none) and whether it held."""

    rule: DecisionRule
    tests: tuple[tuple[Condition, Any, bool], ...]

    @property
    def held(self) -> bool:
        return all(ok for _, _, ok in self.tests)


def trace(rules: Sequence[DecisionRule], intent: Mapping[str, Any], principal: str) -> tuple[Verdict, list[Tried]]:
    """`decide`'s verdict, and each entry it tried up to the one that decided (`receipts rules explain`)."""
    tried = []
    for rule in rules:
        tests = []
        for c in rule.conditions:
            v = value_of(c.field, intent, principal)
            tests.append((c, v, holds(c, v)))
        tried.append(Tried(rule, tuple(tests)))
        if tried[-1].held:
            return Verdict(rule.decision, describe(rule)), tried
    return decide(rules, intent, principal), tried


def describe(rule: DecisionRule) -> str:
    """`decisions[0] (line 12): approve when amount >= 100000: large charges`; a file's: `the file's decisions[0]...`"""
    tests = " and ".join(f"{c.field} {c.op} {shown(c.value)}" for c in rule.conditions)
    said = f": {rule.reason}" if rule.reason else ""
    whose = "the file's " if rule.in_file else ""
    return f"{whose}decisions[{rule.index}] (line {rule.line}): {rule.decision} when {tests}{said}"


def shown(v: Any) -> str:
    pattern = getattr(v, "pattern", None)
    return repr(pattern) if pattern is not None else repr(list(v) if isinstance(v, tuple) else v)


def value_of(field: str, intent: Mapping[str, Any], principal: str) -> Any:
    """The named field's value as the intent records it; MISSING if it has none."""
    if field == PRINCIPAL:
        return principal
    for section in SECTIONS:
        found = intent.get(section)
        if isinstance(found, Mapping) and field in found:
            v = found[field]
            if section in TEXT_SECTIONS:  # `amount=150000` in a form: a number to `amount >= 100000`
                return [FormText(x) if isinstance(x, str) else x for x in v] if isinstance(v, list) else _text(v)
            return v
    return MISSING


def _text(v: Any) -> Any:
    return FormText(v) if isinstance(v, str) else v


def _typed(v: Any, bound: Any) -> Any:
    """A form's decimal text as a number, where the test's value (or one of its list) is a number."""
    if not isinstance(v, FormText):
        return v
    bounds = bound if isinstance(bound, tuple) else (bound,)
    if DECIMAL.fullmatch(v) and any(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds):
        return float(v) if "." in v else int(v)
    return str(v)  # plain text, equal to the same text


NEGATED = {"!=": "==", "not_in": "in", "not_ends_with": "ends_with"}


def holds(c: Condition, v: Any) -> bool:
    """
    Whether the value passes the test; a missing or null value, an empty list, or one of another
    type passes none. A list (`to: [a@x, b@y]`, a repeated form field) passes a test when every
    item does, and a negated test (`!=`, `not_in`, `not_ends_with`) when any item fails its
    positive: `deny: {to: {not_ends_with: "@example.com"}}` denies a list with one outside address.
    """
    if v is MISSING or v is None or v == []:
        return False
    if isinstance(v, list):
        if c.op in NEGATED:
            positive = Condition(c.field, NEGATED[c.op], c.value)
            return not all(_holds_one(positive, x) for x in v)
        return all(_holds_one(c, x) for x in v)
    return _holds_one(c, v)


def _holds_one(c: Condition, v: Any) -> bool:
    if v is None or isinstance(v, (list, dict)):
        return False
    v = _typed(v, c.value)
    if c.op == "==":
        return same_value(v, c.value)
    if c.op == "!=":
        return not same_value(v, c.value)
    if c.op == "in":
        return any(same_value(v, x) for x in c.value)
    if c.op == "not_in":
        return not any(same_value(v, x) for x in c.value)
    if c.op in ("ends_with", "not_ends_with", "matches"):
        if not isinstance(v, str):
            return False
        if c.op == "matches":
            return c.value.search(v) is not None
        return v.lower().endswith(c.value.lower()) == (c.op == "ends_with")
    return _ordered(c.op, v, c.value)


def _ordered(op: str, v: Any, bound: Any) -> bool:
    """<, <=, >, >= between two numbers (never a bool) or two strings; any other pair passes none."""
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (v, bound))
    if not numbers and not (isinstance(v, str) and isinstance(bound, str)):
        return False
    if op == "<":
        return bool(v < bound)
    if op == "<=":
        return bool(v <= bound)
    if op == ">":
        return bool(v > bound)
    return bool(v >= bound)
