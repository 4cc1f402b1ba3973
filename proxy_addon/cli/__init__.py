"""
`receipts`: see and settle the receipts the proxy wrote.

    receipts list --state outcome_unknown     the unresolved ones you care about
    receipts show 20261129T184210Z-1fd54b31a2 one receipt, its history and the duplicates it stopped
    receipts blocked --since 1d               what the proxy blocked or replayed lately
    receipts reconcile --all                  look for the effect of every unknown outcome with a read
    receipts resolve ID --as succeeded --note "the post is live" --external-id 1234567
    receipts pending                          writes held for approval
    receipts approve ID | deny ID --note ...  decide one; the proxy that holds it acts within a second
    receipts budgets                          each budget the rules declare, with its use now
    receipts export --since 2026-11-01 > audit.jsonl
    receipts prune --older-than 90d --dry-run
    receipts verify                           the history is the one the proxy wrote (docs/proof.md)
    receipts rules check                      validate the rules files
    receipts rules explain POST URL --body F  what a request would match and fingerprint; nothing is sent
    receipts demo                             the story the proxy exists for, acted out on 127.0.0.1

Each subcommand is one entry in `COMMANDS`: a function adding its arguments, a function
running it against an open ReceiptStore, and its help. Errors a user can fix are one line,
`Error: ...`, on stderr, with exit status 1; argparse's own usage errors exit 2.

The table is in cli/command_table.py; the commands in cli/receipt_commands.py (list, show,
blocked, export, prune), cli/resolve_command.py, cli/approval_commands.py (pending, approve,
deny), cli/reconcile_command.py, cli/budget_command.py, cli/verify_command.py, cli/rules_commands.py
and cli/demo_command.py (with the demo's proxy, cli/demo_proxy.py, and its API, cli/demo_api.py);
values.py parses what the user types and output.py prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TextIO, cast

from proxy_addon.cli.command_table import COMMANDS, Command, StorelessCommand
from proxy_addon.cli.output import event_json, operation_name, print_json, print_table, receipt_json, short_time
from proxy_addon.cli.values import (
    HEADER_NAME,
    SINCE_HELP,
    UsageError,
    age,
    cli_actor,
    parse_age,
    parse_since,
    positive_int,
    positive_seconds,
    sendable,
)
from proxy_addon.errors import ReceiptsError, StoreError
from proxy_addon.gate.paths import default_db
from proxy_addon.store import Clock, is_postgres, open_store, utcnow
from proxy_addon.wire.terminal import EscapingWriter

__all__ = [
    "COMMANDS",
    "EPILOG",
    "HEADER_NAME",
    "SINCE_HELP",
    "Command",
    "StorelessCommand",
    "UsageError",
    "age",
    "cli_actor",
    "event_json",
    "main",
    "operation_name",
    "parse_age",
    "parse_since",
    "parser",
    "positive_int",
    "positive_seconds",
    "print_json",
    "print_table",
    "receipt_json",
    "sendable",
    "short_time",
]

EPILOG = """\
examples:
  receipts list
  receipts list --state outcome_unknown --state manual_review
  receipts list --operation dev.to/articles.create --since 7d --json | jq '.[0]'
  receipts show 20261129T184210Z-1fd54b31a2
  receipts blocked --since 2h
  receipts report --since 1d
  receipts reconcile --all --header 'api-key: ...'
  receipts resolve 20261129T184210Z-1fd54b31a2 --as succeeded --note "article is live" --external-id 1234567
  receipts pending --json
  receipts approve 20261129T190502Z-7c1e02d9aa --note "refund agreed"
  receipts deny 20261129T190502Z-7c1e02d9aa --note "amount too high, ask finance"
  receipts budgets --json
  receipts export --since 2026-11-01 > receipts.jsonl
  receipts prune --older-than 90d --dry-run
  receipts verify --db /var/lib/receipt-proxy/receipts.db
  receipts rules check rules/
  receipts rules explain POST https://api.github.com/repos/o/r/issues --body issue.json
  receipts --db /var/lib/receipt-proxy/receipts.db list
  receipts demo | less

Run `receipts COMMAND --help` for a command's options.

The database is --db, else $RECEIPT_PROXY_DB, else $RECEIPT_PROXY_STATE_DIR/receipts.db,
else ~/.local/state/receipt-proxy/receipts.db (where scripts/run keeps it).
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="receipts",
        description="See and settle the receipts receipt-proxy wrote.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", default=None, help="the receipts database (default: see below)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, c in COMMANDS.items():
        sp = sub.add_parser(
            name,
            help=c.help,
            description=c.description,
            epilog="examples:\n" + "".join(f"  {e}\n" for e in c.examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        c.add_arguments(sp)
    return p


def main(argv: list[str] | None = None, *, clock: Clock = utcnow) -> int:
    """Run one command. Everything it prints passes EscapingWriter: no raw control characters reach a terminal."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = cast(TextIO, EscapingWriter(out)), cast(TextIO, EscapingWriter(err))
    try:
        return _main(argv, clock=clock)
    finally:
        sys.stdout, sys.stderr = out, err


def _main(argv: list[str] | None, *, clock: Clock) -> int:
    args = parser().parse_args(argv)
    if args.command is None:
        parser().print_help()
        return 0
    given = args.db or default_db()
    db: str | Path = given if is_postgres(given) else Path(given).expanduser()
    store = None
    try:
        command = COMMANDS[args.command]
        if isinstance(command, StorelessCommand):
            return command.run(args)
        try:
            store = open_store(db, create=False, clock=clock)
        except StoreError as e:
            hint = (
                ""
                if args.db or isinstance(db, str) or db.exists()
                else " (pass --db, or set $RECEIPT_PROXY_DB or $RECEIPT_PROXY_STATE_DIR)"
            )
            raise StoreError(f"{e}{hint}") from e
        return command.run(store, args)
    except (ReceiptsError, UsageError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `receipts export | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    finally:
        if store is not None:
            store.close()
