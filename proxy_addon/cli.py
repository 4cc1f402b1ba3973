"""
`receipts`: see and settle the receipts the proxy wrote.

    receipts list                          newest first, with how many duplicates were blocked or replayed
    receipts list --state outcome_unknown  only the unresolved ones you care about
    receipts show 20261129T184210Z-1fd54b31a2
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from pathlib import Path

from proxy_addon.errors import ReceiptsError
from proxy_addon.states import State
from proxy_addon.store import Receipt, Store

DEFAULT_DB = "~/.local/state/receipt-proxy/receipts.db"

EPILOG = """\
examples:
  receipts list
  receipts list --state outcome_unknown --state manual_review
  receipts list --json | jq '.[0]'
  receipts show 20261129T184210Z-1fd54b31a2
  receipts --db ./.state/receipts.db list

The database is --db, else $RECEIPT_PROXY_DB, else $RECEIPT_PROXY_STATE_DIR/receipts.db,
else ~/.local/state/receipt-proxy/receipts.db (where scripts/run keeps it).
"""


def default_db() -> str:
    if os.environ.get("RECEIPT_PROXY_DB"):
        return os.environ["RECEIPT_PROXY_DB"]
    if os.environ.get("RECEIPT_PROXY_STATE_DIR"):
        return str(Path(os.environ["RECEIPT_PROXY_STATE_DIR"]) / "receipts.db")
    return DEFAULT_DB


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="receipts", description="See and settle the receipts receipt-proxy wrote.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", default=None, help="the receipts database (default: see below)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    ls = sub.add_parser("list", help="list receipts, newest first",
                        description="List receipts, newest first.\n\nexample: receipts list --state outcome_unknown",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ls.add_argument("--state", action="append", choices=[s.value for s in State], default=[],
                    help="only receipts in this state (repeatable)")
    ls.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show = sub.add_parser("show", help="one receipt with its event history",
                          description="One receipt with its event history.\n\nexample: receipts show 20261129T184210Z-1fd54b31a2",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("operation_id")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


def _summary(r: Receipt) -> dict:
    return {
        "operation_id": r.operation_id, "api": r.api, "operation": r.operation, "method": r.method,
        "target": r.target, "state": str(r.state), "intent_fingerprint": r.intent_fingerprint,
        "intent": r.intent, "submitted_at": r.submitted_at, "completed_at": r.completed_at,
        "http_status": r.http_status, "error": r.error, "external_id": r.external_id,
        "retry_of": r.retry_of, "flow_id": r.flow_id,
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command is None:
        parser().print_help()
        return 0
    db = Path(args.db or default_db()).expanduser()
    try:
        store = Store.open(db, create=False)
        if args.command == "list":
            receipts = store.list(states=[State(s) for s in args.state], limit=args.limit)
            dups = store.duplicate_counts([r.operation_id for r in receipts])
            if args.json:
                print(json.dumps([{**_summary(r), **dups[r.operation_id]} for r in receipts], indent=2))
            elif not receipts:
                print(f"no receipts in {db}")
            else:
                print(f"{'OPERATION ID':28} {'STATE':16} {'OPERATION':28} {'HTTP':>4} {'BLOCKED':>7} {'REPLAYED':>8}  TARGET")
                for r in receipts:
                    d = dups[r.operation_id]
                    print(f"{r.operation_id:28} {r.state:16} {r.api + ' ' + r.operation:28} "
                          f"{r.http_status or '':>4} {d['blocked'] or '':>7} {d['replayed'] or '':>8}  {r.target}")
        elif args.command == "show":
            r = store.get(args.operation_id)
            events = store.events(r.operation_id)
            if args.json:
                print(json.dumps({**_summary(r), "events": [e.__dict__ for e in events]}, indent=2, default=str))
            else:
                for k, v in _summary(r).items():
                    print(f"{k:19} {json.dumps(v) if isinstance(v, dict) else v if v is not None else '-'}")
                print("events:")
                for e in events:
                    change = f"{e.from_state or '(new)'} → {e.to_state}" if e.event == "transition" else e.event
                    print(f"  {e.at}  {change:36} {e.actor:8} {e.reason}")
    except ReceiptsError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except sqlite3.Error as e:
        print(f"Error: {db}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
