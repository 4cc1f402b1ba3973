"""
`receipts budgets`: each budget the rules declare, with its use in the current window.

    OPERATION               BUDGET     LIMIT           PER          USED                WINDOW ENDS IN
    test-api things.create  budget[0]  20 writes / 1h  principal    12 (most)           41m 3s
                                                         3f2a9c…    12 (12 writes)

Counted as the proxy counts (store/budgets.py): the current window's receipts of the budget that
did not end rejected or not_sent, every proxy's that shares the database.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from proxy_addon.cli.output import print_json, print_table
from proxy_addon.cli.values import UsageError, positive_int
from proxy_addon.errors import RulesError
from proxy_addon.gate.paths import default_rules
from proxy_addon.intent.budget_charges import budget_key
from proxy_addon.rules import load_rules_path
from proxy_addon.rules.model import window_text
from proxy_addon.store import ReceiptStore
from proxy_addon.store.budgets import window_of


def budgets_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rules",
        default=None,
        help="the rules file or folder that declares the budgets (default: $RECEIPT_PROXY_RULES, else rules/)",
    )
    p.add_argument(
        "--top", type=positive_int, default=5, metavar="N", help="per principal: the N that used most (default 5)"
    )
    p.add_argument("--json", action="store_true", help="print a JSON array instead of a table")


def budgets_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    try:
        rules = load_rules_path(args.rules or default_rules())
    except RulesError as e:
        raise UsageError(f"--rules: {e}") from None
    now = store.clock()
    found: list[dict[str, Any]] = []
    for op in rules.operations:
        for b in op.budgets:
            key = budget_key(op, b)
            uses = store.budget_use(key, b.window, top=args.top)
            start, end = window_of(now, b.window)
            found.append(
                {
                    "api": op.api,
                    "operation": op.name,
                    "budget": f"budget[{b.index}]",
                    "key": key,
                    "per": b.per,
                    "window": window_text(b.window),
                    "measure": "count" if b.sum is None else "sum",
                    "sum": b.sum,
                    "limit": b.limit,
                    "used": uses[0].used if uses else 0,  # per principal: the most any one principal used
                    "window_start": start,
                    "window_end": end,
                    "ends_in_seconds": max(0, math.ceil(end - now.timestamp())),
                    "top": [{"principal": u.principal, "used": u.used, "writes": u.writes} for u in uses]
                    if b.per == "principal"
                    else [],
                }
            )
    if args.json:
        print_json(found)
    elif not found:
        print(f"no budgets in the rules ({args.rules or default_rules()})")
    else:
        _table(found)
    return 0


def _table(found: list[dict[str, Any]]) -> None:
    rows: list[list[Any]] = []
    for b in found:
        limit = f"{_n(b['limit'])} writes" if b["measure"] == "count" else f"{b['sum']} ≤ {_n(b['limit'])}"
        used = _n(b["used"]) if b["per"] == "operation" else f"{_n(b['used'])} (most)"
        ends = b["ends_in_seconds"]
        rows.append(
            [f"{b['api']} {b['operation']}", b["budget"], f"{limit} / {b['window']}", b["per"], used, _dur(ends)]
        )
        for u in b["top"]:
            rows.append(["", "", "", f"  {u['principal']}", f"{_n(u['used'])} ({u['writes']} writes)", ""])
    print_table(["OPERATION", "BUDGET", "LIMIT", "PER", "USED", "WINDOW ENDS IN"], rows)


def _n(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _dur(seconds: int) -> str:
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return " ".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v) or "0s"
