"""
Loading an operation's `decisions:`: allow, approve or deny a write by what its intent says.

    decisions:
      - approve: {amount: {">=": 100000}}
        reason: large charges need a person
      - deny: {to: {not_ends_with: "@example.com"}}
      - allow: {amount: {">=": 100, "<": 100000}}     # a band: both ends

Each condition names a field the fingerprint names (a body field, a path or query parameter, a
header) or `principal`: a decision rests only on what the receipt records. A bare value means
`==`. Evaluated by intent/decisions.py.

A file's own `decisions:` (top level) apply to every operation of the file, after the operation's
own (`with_file_decisions`). Each of their fields must be named by the fingerprint of every
operation: a field one operation does not record is refused, naming the file, the line and the
operation (a decision never silently skips an operation that cannot be tested).
"""

from __future__ import annotations

import re
from dataclasses import replace

import yaml

from proxy_addon.errors import RulesError
from proxy_addon.rules.model import (
    CONDITION_OPS,
    DECISIONS,
    KEYS,
    PRINCIPAL,
    Condition,
    DecisionRule,
    FingerprintSpec,
    Operation,
)
from proxy_addon.rules.nodes import Ctx, node_kind, scalar_value

ORDERED = ("<", "<=", ">", ">=")
TEXT = ("ends_with", "not_ends_with", "matches")


def named_fields(fp: FingerprintSpec) -> set[str]:
    """The names a condition may test: the fingerprint's fields, and the principal."""
    return {*(fp.body or ()), *fp.path, *fp.query, *fp.headers, PRINCIPAL}


def load_decisions(ctx: Ctx, node: yaml.Node, where: str, fp: FingerprintSpec | None) -> tuple[DecisionRule, ...]:
    """The list of `decisions:`; `fp` None: the fingerprint did not load (or a file's list: checked
    per operation by `with_file_decisions`), names are left unchecked."""
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.error(node, where, f"expected a list of decisions, got {node_kind(node)}")
    out: list[DecisionRule] = []
    for i, item in enumerate(node.value):
        rule = ctx.attempt(_decision, ctx, item, f"{where}[{i}]", i, fp)
        if rule is not None:
            out.append(rule)
    return tuple(out)


def with_file_decisions(ctx: Ctx, node: yaml.Node, operations: list[Operation]) -> list[Operation]:
    """
    The operations with the file's `decisions:` after their own. A field an operation's fingerprint
    does not name is reported (file, line, operation), once per condition and operation.
    """
    rules = tuple(replace(r, in_file=True) for r in load_decisions(ctx, node, "decisions", None))
    for op in operations:
        allowed = named_fields(op.fingerprint)
        for rule in rules:
            for name, line in {c.field: c.line for c in rule.conditions}.items():
                if name not in allowed:
                    ctx.report(
                        RulesError(
                            f"{name!r} is not a field the fingerprint of operation {op.name!r} names; the file's "
                            f"decisions apply to every operation, and {op.name!r} records only "
                            f"{', '.join(sorted(allowed))}",
                            source=ctx.source,
                            line=line,
                            field=f"decisions[{rule.index}].{rule.decision}.{name}",
                        )
                    )
    return [replace(op, decisions=op.decisions + rules) for op in operations]


def _decision(ctx: Ctx, node: yaml.Node, where: str, index: int, fp: FingerprintSpec | None) -> DecisionRule:
    entry = ctx.mapping(node, where, KEYS["decision"])
    said = [d for d in DECISIONS if d in entry]
    if len(said) != 1:
        raise ctx.error(node, where, f"say exactly one of {', '.join(DECISIONS)}")
    decision = said[0]
    reason = ctx.string(entry["reason"][1], f"{where}.reason") if "reason" in entry else None
    cond_node = entry[decision][1]
    f = f"{where}.{decision}"
    if not isinstance(cond_node, yaml.MappingNode) or not cond_node.value:
        raise ctx.error(cond_node, f, f"expected a mapping of field: condition, got {node_kind(cond_node)}")
    conditions: list[Condition] = []
    allowed = named_fields(fp) if fp is not None else None
    for key, value in cond_node.value:
        name = key.value if isinstance(key, yaml.ScalarNode) else ""
        fw = f"{f}.{name}"
        if allowed is not None and name not in allowed:
            raise ctx.error(
                key,
                fw,
                f"{name!r} is not a field the fingerprint names; a decision may test only "
                f"{', '.join(sorted(allowed))} (what the receipt records)",
            )
        conditions.extend(replace(c, line=key.start_mark.line + 1) for c in _conditions(ctx, name, value, fw))
    return DecisionRule(decision, tuple(conditions), reason, node.start_mark.line + 1, index)


def _conditions(ctx: Ctx, name: str, node: yaml.Node, where: str) -> list[Condition]:
    if isinstance(node, yaml.ScalarNode):
        return [Condition(name, "==", scalar_value(node))]
    if not isinstance(node, yaml.MappingNode) or not node.value:
        raise ctx.error(node, where, f"expected a value or a mapping of tests, got {node_kind(node)}")
    out = []
    for key, value in node.value:
        op = key.value if isinstance(key, yaml.ScalarNode) else ""
        ow = f"{where}.{op}"
        if op not in CONDITION_OPS:
            raise ctx.error(key, ow, f"unknown test {op!r}; expected one of: {', '.join(CONDITION_OPS)}")
        if op in ("in", "not_in"):
            if not isinstance(value, yaml.SequenceNode) or not all(isinstance(v, yaml.ScalarNode) for v in value.value):
                raise ctx.error(value, ow, f"expected a list of values, got {node_kind(value)}")
            out.append(Condition(name, op, tuple(scalar_value(v) for v in value.value)))
            continue
        if not isinstance(value, yaml.ScalarNode):
            raise ctx.error(value, ow, f"expected a value, got {node_kind(value)}")
        v = scalar_value(value)
        if op in ORDERED and (isinstance(v, bool) or not isinstance(v, (int, float, str))):
            raise ctx.error(value, ow, f"expected a number or a string to compare with, got {node_kind(value)}")
        if op in TEXT and not (isinstance(v, str) and v):
            raise ctx.error(value, ow, f"expected a non-empty string, got {node_kind(value)}")
        if op == "matches":
            try:
                v = re.compile(v)
            except re.error as e:
                raise ctx.error(value, ow, f"is not a valid regular expression: {e}") from None
        out.append(Condition(name, op, v))
    return out
