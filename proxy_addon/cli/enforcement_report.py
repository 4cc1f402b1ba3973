"""
`receipts report`: what enforcement did, or in observe mode (receipts_mode=observe) would have done,
in a time: per api and operation, the writes recorded, the duplicates blocked and replayed, the writes
held for approval, denied by a decision or refused, each with a few receipt ids, from the receipts'
events (store/queries.py `enforcement_since`). Observe mode's counts are marked "would have": those
writes were sent.
"""

from __future__ import annotations

import argparse
from typing import Any

from proxy_addon.cli.output import print_json, print_table, short_time
from proxy_addon.cli.values import SINCE_HELP, parse_since, positive_int
from proxy_addon.store import Enforcement, ReceiptStore

# A column of the report: the kind enforcement records when it acts, and observe mode's event for the same.
COLUMNS = {
    "blocked": ("blocked", "would_block"),
    "replayed": ("replayed", "would_replay"),
    "held": ("held", "would_hold"),
    "denied": ("denied", "would_deny"),
    # over a budget: a new receipt recorded rejected, "over budget: ..." (store/attempts.py `_refusal`)
    "refused": ("refused", "would_refuse"),
}


def report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", metavar="T", default="1d", help=SINCE_HELP + "; default 1d")
    p.add_argument(
        "--examples", type=positive_int, default=3, metavar="N", help="receipt ids shown of each kind (default 3)"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def report_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    since = parse_since(args.since, store.clock())
    assert since is not None
    seen = store.enforcement_since(since, examples=args.examples)
    rows = summary(seen)
    if args.json:
        print_json({"since": since, "operations": rows})
        return 0
    observed = sum(row[c]["would_have"] for row in rows for c in COLUMNS)
    print(f"since {since} in {store.location}:")
    if observed:
        print(
            f"observe mode (receipts_mode=observe): {observed} write(s) below were SENT although enforcement would "
            "have blocked, replayed, held, denied or refused them (counted as 'N would')"
        )
    if not print_table(["OPERATION", "WRITES", *(c.upper() for c in COLUMNS)], [_row(r) for r in rows]):
        print("no writes recorded, and nothing blocked, replayed, held, denied or refused")
        return 0
    examples = [
        [kind, f"{r['api']}/{r['operation']}", x["operation_id"], short_time(x["at"]), x["reason"]]
        for r in rows
        for c in COLUMNS
        for kind, xs in (("done", r[c]["examples"]), ("would", r[c]["would_have_examples"]))
        for x in xs
    ]
    if examples:
        print(f"\nexamples (the newest {args.examples} of each):")
        print_table(["", "OPERATION", "RECEIPT", "TIME", "REASON"], examples)
    return 0


def summary(seen: Enforcement) -> list[dict[str, Any]]:
    """One dict per api and operation: its writes, and for each column its counts done and would-have, with examples."""
    ops = sorted({*seen.writes, *((api, op) for api, op, _ in seen.counts)})
    rows: list[dict[str, Any]] = []
    for api, op in ops:
        row: dict[str, Any] = {"api": api, "operation": op, "writes": seen.writes.get((api, op), 0)}
        for column, (done, would) in COLUMNS.items():
            row[column] = {
                "done": seen.counts.get((api, op, done), 0) if done else 0,
                "would_have": seen.counts.get((api, op, would), 0),
                "examples": _examples(seen, api, op, done),
                "would_have_examples": _examples(seen, api, op, would),
            }
        rows.append(row)
    return rows


def _examples(seen: Enforcement, api: str, op: str, kind: str | None) -> list[dict[str, str]]:
    return [
        {"operation_id": x.operation_id, "at": x.at, "reason": x.reason}
        for a, o, k, x in seen.examples
        if (a, o, k) == (api, op, kind)
    ]


def _row(r: dict[str, Any]) -> list[Any]:
    cells: list[Any] = [f"{r['api']}/{r['operation']}", r["writes"]]
    for column in COLUMNS:
        done, would = r[column]["done"], r[column]["would_have"]
        parts = ([str(done)] if done else []) + ([f"{would} would"] if would else [])
        cells.append(" + ".join(parts))
    return cells
