"""
What a write takes of its operation's budgets (`budget:`, rules/load_budgets.py), as the store counts it.

    charges = charges_of(op, intent.intent, intent.principal)   # (Charge(key, amount=1, ...), ...)

A counted budget takes 1; a summed one takes its field's value as the intent records it (a
number; in a form body, a decimal text such as `1500` or `12.50`). A write whose summed field is
missing, null, negative or no number cannot be counted: UncountableWrite, answered 400 and never
sent. The budget's key names its api, operation, place in the list, window and measure, so that an
edited budget (another window, another field) starts afresh; its limit may change freely.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from proxy_addon.errors import UncountableWrite
from proxy_addon.rules.model import Budget, Operation
from proxy_addon.store.records import Charge

# Where the intent keeps named fields: a JSON body, a form, a multipart body, an MCP call's arguments, the target.
SECTIONS = ("body", "form", "multipart", "arguments", "path", "query", "headers")
DECIMAL = re.compile(r"^[0-9]+(\.[0-9]+)?\Z")  # a number written as text (a form's field): digits, one dot


def budget_key(op: Operation, b: Budget) -> str:
    """`test-api/things.create/budget[0]/3600s/count`: one budget, whoever the principal (Charge.principal)."""
    measure = "count" if b.sum is None else f"sum:{b.sum}"
    return f"{op.api}/{op.name}/budget[{b.index}]/{b.window}s/{measure}"


def charges_of(op: Operation, intent: Mapping[str, Any], principal: str) -> tuple[Charge, ...]:
    """What a new receipt of this write takes of each budget; UncountableWrite if a summed field has no number."""
    return tuple(
        Charge(
            key=budget_key(op, b),
            amount=1.0 if b.sum is None else amount(op, b, intent),
            window=b.window,
            limit=float(b.limit),
            what=f"{op.api} {op.name} {b.describe()}",
            principal=principal if b.per == "principal" else "",
        )
        for b in op.budgets
    )


def amount(op: Operation, b: Budget, intent: Mapping[str, Any]) -> float:
    """The summed field's value (a number >= 0, or decimal text); else UncountableWrite naming the field."""
    assert b.sum is not None
    v = next((found[b.sum] for s in SECTIONS if isinstance(found := intent.get(s), Mapping) and b.sum in found), None)
    if isinstance(v, str) and DECIMAL.match(v):
        v = float(v)
    if v is None:
        problem = "the request has no such field"
    elif isinstance(v, bool) or not isinstance(v, (int, float)):
        problem = "its value is not a number (a number too large or too precise is kept only as a keyed hash)"
    elif not math.isfinite(v) or v < 0:
        problem = "its value is not a number of 0 or more"
    else:
        return float(v)
    raise UncountableWrite(
        f"{op.api} {op.name} {b.describe()} sums {b.sum!r}, and {problem}: the write cannot be counted, so it is "
        f"not sent"
    )
