"""
Loading `classify:` (how an answer's status, body and headers decide its state) and the
rules it is made of, which a reconcile read's `absent_when:` uses too.

    classify: {409: rejected, 5xx: outcome_unknown}          # a map: status → state
    classify:                                                 # or a list of rules, tried in order
      - {status: 409, body: {error.code: duplicate}, state: already_exists}
"""

from __future__ import annotations

import re

import yaml

from proxy_addon.rules.model import ALREADY_EXISTS, CLASSIFIABLE, KEYS, Check, ClassifyRule
from proxy_addon.rules.nodes import DOTTED, HEADER, Ctx, node_kind, scalar_value
from proxy_addon.states import State

_STATUS_KEY = re.compile(r"^([1-5])([0-9][0-9]|xx)\Z")


def load_classify(
    ctx: Ctx, node: yaml.Node, field_: str
) -> tuple[tuple[tuple[str, str], ...], tuple[ClassifyRule, ...]]:
    """An operation's `classify:`: a map of status → state (exact codes first), or a list of rules.
    Each bad entry or rule is reported to `ctx` and the next one read."""
    if isinstance(node, yaml.SequenceNode):
        if not node.value:
            raise ctx.error(node, field_, "must list at least one rule")
        rules = [ctx.attempt(load_classify_rule, ctx, item, f"{field_}[{i}]") for i, item in enumerate(node.value)]
        return (), tuple(r for r in rules if r is not None)
    classify: list[tuple[str, str]] = []
    for status, (knode, vnode) in ctx.entries(node, field_).items():
        where = f"{field_}.{status}"
        key = ctx.attempt(_status_key, ctx, knode, status, where)
        verdict = ctx.attempt(_verdict, ctx, vnode, where)
        if key is not None and verdict is not None:
            classify.append((key, verdict))
    classify.sort(key=lambda kv: kv[0].endswith("xx"))  # exact codes first
    return tuple(classify), ()


def load_classify_rule(ctx: Ctx, node: yaml.Node, field_: str, *, verdict: bool = True) -> ClassifyRule:
    """One rule: the status, body fields and headers it tests, and (with `verdict`) the state it gives."""
    keys = KEYS["classify_rule"] if verdict else KEYS["absent_when"]
    rule = ctx.mapping(node, field_, keys, ("state",) if verdict else ())
    statuses: list[str] = []
    if "status" in rule:
        snode = rule["status"][1]
        items = snode.value if isinstance(snode, yaml.SequenceNode) else [snode]
        for i, item in enumerate(items):
            where = f"{field_}.status" + (f"[{i}]" if isinstance(snode, yaml.SequenceNode) else "")
            if not isinstance(item, yaml.ScalarNode) or not item.value:
                raise ctx.error(
                    item, where, f"expected a status code (like 409) or class (like 4xx), got {node_kind(item)}"
                )
            statuses.append(_status_key(ctx, item, item.value, where))
    body = _checks(ctx, rule, "body", field_, DOTTED, "is not a dotted field path (use * for any item of a list)")
    headers = [
        (name.lower(), check)
        for name, check in _checks(ctx, rule, "headers", field_, HEADER, "is not a valid header name")
    ]
    if not (statuses or body or headers):
        raise ctx.error(node, field_, "a rule that tests nothing fits every answer; give status, body or headers")
    reason = ctx.string(rule["reason"][1], f"{field_}.reason") if "reason" in rule else None
    state = _verdict(ctx, rule["state"][1], f"{field_}.state") if verdict else ""
    return ClassifyRule(
        state=state,
        statuses=tuple(statuses),
        body=tuple(body),
        headers=tuple(headers),
        reason=reason,
        line=node.start_mark.line + 1,
    )


def _status_key(ctx: Ctx, node: yaml.Node, status: str, field_: str) -> str:
    if not _STATUS_KEY.match(status.lower()):
        raise ctx.error(node, field_, f"{status!r} is not a status code (like 409) or class (like 4xx)")
    return status.lower()


def _verdict(ctx: Ctx, node: yaml.Node, field_: str) -> str:
    state = ctx.string(node, field_)
    allowed = (*CLASSIFIABLE, ALREADY_EXISTS)
    if state not in allowed:
        raise ctx.error(node, field_, f"{state!r} is not one of {', '.join(allowed)}")
    return state if state == ALREADY_EXISTS else State(state)


def _check(ctx: Ctx, node: yaml.Node, field_: str) -> Check:
    if isinstance(node, yaml.ScalarNode):
        return Check("equal", scalar_value(node))
    if isinstance(node, yaml.SequenceNode):
        values = []
        for i, item in enumerate(node.value):
            if not isinstance(item, yaml.ScalarNode):
                raise ctx.error(item, f"{field_}[{i}]", f"expected a value, got {node_kind(item)}")
            values.append(scalar_value(item))
        if not values:
            raise ctx.error(node, field_, "must list at least one value")
        return Check("one_of", tuple(values))
    test = ctx.mapping(node, field_, KEYS["check"])
    if len(test) != 1:
        raise ctx.error(node, field_, f"expected one test: {', '.join(KEYS['check'])}")
    ((kind, (_, vnode)),) = test.items()
    where = f"{field_}.{kind}"
    if kind == "present":
        return Check(kind, ctx.boolean(vnode, where))
    text = ctx.string(vnode, where)
    if kind == "matches":
        try:
            return Check(kind, re.compile(text))
        except re.error as e:
            raise ctx.error(vnode, where, f"{text!r} is not a valid regular expression: {e}") from None
    return Check(kind, text)


def _checks(
    ctx: Ctx, rule: dict, key: str, field_: str, valid: re.Pattern[str], invalid: str
) -> list[tuple[str, Check]]:
    """A rule's `body` or `headers`: name → test, each name checked against `valid`."""
    out = []
    for name, (knode, vnode) in ctx.entries(rule[key][1], f"{field_}.{key}").items() if key in rule else ():
        if not valid.match(name):
            raise ctx.error(knode, f"{field_}.{key}.{name}", f"{name!r} {invalid}")
        out.append((name, _check(ctx, vnode, f"{field_}.{key}.{name}")))
    return out
