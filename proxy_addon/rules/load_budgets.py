"""
Loading an operation's `budget:`: how many writes, or how much of a named field, per window.

    budget: {per: principal, window: 1h, count: 20}          # 20 writes an hour, per caller
    budget:                                                   # or a list: each must have room
      - {window: 1h, count: 100}
      - {window: 1d, sum: amount, max: 500000}                # the day's amounts, every caller's

`per` is `operation` (the default: one budget the whole fleet shares) or `principal` (one per
caller). `window` is a duration (`30s`, `5m`, `1h`, `1d`): fixed windows aligned to the UTC epoch.
Exactly one of `count` (a whole number of writes, at least 1) and `sum` (a field the fingerprint
names) with `max` (a number above 0). Counted by store/budgets.py.
"""

from __future__ import annotations

import math

import yaml

from proxy_addon.rules.model import BUDGET_PER, KEYS, Budget, FingerprintSpec
from proxy_addon.rules.nodes import Ctx, node_kind, scalar_value

_YEAR = 366 * 86400  # the longest window: a longer one would keep every charge for years


def load_budgets(ctx: Ctx, node: yaml.Node, where: str, fp: FingerprintSpec | None) -> tuple[Budget, ...]:
    """`budget:` one mapping or a list of them; `fp` None: the fingerprint did not load, `sum` is left unchecked."""
    items = node.value if isinstance(node, yaml.SequenceNode) else [node]
    if isinstance(node, yaml.SequenceNode) and not items:
        raise ctx.error(node, where, "expected a budget or a list of budgets, got an empty list")
    out: list[Budget] = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]" if isinstance(node, yaml.SequenceNode) else where
        budget = ctx.attempt(_budget, ctx, item, at, i, fp)
        if budget is not None:
            out.append(budget)
    return tuple(out)


def _budget(ctx: Ctx, node: yaml.Node, where: str, index: int, fp: FingerprintSpec | None) -> Budget:
    entry = ctx.mapping(node, where, KEYS["budget"], ("window",))
    per = "operation"
    if "per" in entry:
        per = ctx.string(entry["per"][1], f"{where}.per")
        if per not in BUDGET_PER:
            raise ctx.error(entry["per"][1], f"{where}.per", f"expected one of {', '.join(BUDGET_PER)}, got {per!r}")
    window = ctx.duration(entry["window"][1], f"{where}.window")
    if not 0 < window <= _YEAR:
        raise ctx.error(entry["window"][1], f"{where}.window", "expected a window of 1s to 366d")
    if ("count" in entry) == ("sum" in entry):
        raise ctx.error(node, where, "say exactly one of count (writes per window) and sum (a field, with max)")
    if "count" in entry:
        if "max" in entry:
            raise ctx.error(entry["max"][0], f"{where}.max", "goes with sum; a count is its own limit")
        count = _number(ctx, entry["count"][1], f"{where}.count")
        if not isinstance(count, int) or count < 1:
            raise ctx.error(entry["count"][1], f"{where}.count", "expected a whole number of writes, at least 1")
        return Budget(window, count, per, None, index, node.start_mark.line + 1)
    field = ctx.string(entry["sum"][1], f"{where}.sum")
    named = {*(fp.body or ()), *fp.path, *fp.query, *fp.headers} if fp is not None else None
    if named is not None and field not in named:
        shown = ", ".join(sorted(named)) or "none"
        raise ctx.error(
            entry["sum"][1],
            f"{where}.sum",
            f"{field!r} is not a field the fingerprint names; a budget may sum only {shown} (what the receipt records)",
        )
    if "max" not in entry:
        raise ctx.error(node, f"{where}.max", "is required with sum: the most the window's writes may add up to")
    limit = _number(ctx, entry["max"][1], f"{where}.max")
    if limit <= 0:
        raise ctx.error(entry["max"][1], f"{where}.max", "expected a number above 0")
    return Budget(window, limit, per, field, index, node.start_mark.line + 1)


def _number(ctx: Ctx, node: yaml.Node, where: str) -> int | float:
    value = scalar_value(node) if isinstance(node, yaml.ScalarNode) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ctx.error(node, where, f"expected a number, got {node_kind(node)}")
    return value
