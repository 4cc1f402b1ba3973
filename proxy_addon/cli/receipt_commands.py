"""The commands that read receipts (`list`, `show`, `blocked`, `export`) and the one that deletes old ones (`prune`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator

from proxy_addon.cli.output import (
    event_json,
    operation_name,
    print_json,
    print_json_array,
    print_table,
    receipt_json,
    short_time,
)
from proxy_addon.cli.values import SINCE_HELP, UsageError, age, parse_age, parse_since, positive_int
from proxy_addon.errors import StoreError
from proxy_addon.proof.bundle_lines import bundle_lines
from proxy_addon.states import State
from proxy_addon.store import WOULD_HAVE, Receipt, ReceiptStore, iso
from proxy_addon.store.applied_decisions import applied_decisions
from proxy_addon.store.records import DUPLICATE_SENT

# Counted per receipt by `list`: duplicates blocked and replayed, and observe mode's events (receipts_mode=observe)
LISTED_EVENTS = ("blocked", "replayed", *WOULD_HAVE, DUPLICATE_SENT)


def list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state",
        action="append",
        choices=[s.value for s in State],
        default=[],
        metavar="STATE",
        help=f"only receipts in this state (repeatable): {', '.join(s.value for s in State)}",
    )
    p.add_argument("--operation", metavar="OP", help="only this operation: articles.create or dev.to/articles.create")
    p.add_argument("--since", metavar="T", help="only receipts submitted " + SINCE_HELP.removeprefix("only "))
    p.add_argument("--limit", type=positive_int, default=50, metavar="N", help="at most N receipts (default 50)")
    p.add_argument("--json", action="store_true", help="print a JSON array instead of a table")


def list_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    """Printed as read, a page at a time (store.list_pages): `--limit 1000000` holds one page, not every row."""
    now = store.clock()
    since = parse_since(args.since, now)
    pages = store.list_pages(
        states=[State(s) for s in args.state], operation=args.operation, since=since, limit=args.limit
    )

    def counted() -> Iterator[tuple[Receipt, dict[str, int]]]:
        for page in pages:
            dups = store.duplicate_counts([r.operation_id for r in page], LISTED_EVENTS)
            yield from ((r, dups[r.operation_id]) for r in page)

    if args.json:
        print_json_array({**receipt_json(r), **dup} for r, dup in counted())
        return 0
    rows = (
        [
            r.operation_id,
            age(r.submitted_at, now),
            operation_name(r),
            r.state,
            r.http_status,
            r.external_id,
            dup["blocked"] or None,
            dup["replayed"] or None,
            observed(dup),
            r.target,
        ]
        for r, dup in counted()
    )
    headers = ["ID", "AGE", "OPERATION", "STATE", "HTTP", "EXTERNAL-ID", "BLOCKED", "REPLAYED", "OBSERVE", "TARGET"]
    if not print_table(headers, rows):
        filtered = args.state or args.operation or since
        print(f"no receipts in {store.location}" + (" match these filters" if filtered else ""))
    return 0


def observed(counts: dict[str, int]) -> str | None:
    """
    The OBSERVE cell of `list`: what enforcement would have done to a receipt observe mode sent ("would
    block"), and how many duplicates of it were sent ("2 dups sent") where it would have blocked them.
    """
    said = [kind.replace("_", " ") for kind in WOULD_HAVE if counts.get(kind)]
    if sent := counts.get(DUPLICATE_SENT):
        said.append(f"{sent} dup{'s' if sent > 1 else ''} sent")
    return ", ".join(said) or None


def show_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("operation_id", metavar="ID", help="the receipt's operation id (first column of `receipts list`)")
    p.add_argument("--json", action="store_true", help="print JSON: the receipt, its events and its duplicates")


def show_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    r = store.get(args.operation_id)
    every = store.events(r.operation_id)
    events = [e for e in every if e.event not in ("blocked", "replayed")]
    dups = [e for e in every if e.event in ("blocked", "replayed")]
    decisions = [dataclasses.asdict(d) for d in applied_decisions(every)]
    if args.json:
        print_json(
            {
                **receipt_json(r),
                "events": [event_json(e) for e in events],
                "duplicates": [event_json(e) for e in dups],
                "decisions": decisions,
            }
        )
        return 0
    for k, v in receipt_json(r).items():
        if k == "raw_target" and v is None:
            continue  # sent in its canonical form: `target` says it all
        text = "-" if v is None else json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
        print(f"{k:19} {text}")
    print("events:")
    for e in events:
        change = f"{e.from_state or '(new)'} → {e.to_state}" if e.event == "transition" else e.event
        print(f"  {e.at}  {change:36} {e.actor:10} {e.reason}")
    print("decisions:" if decisions else "decisions: none")
    for d in decisions:
        print(f"  {d['at']}  {d['decision']:36} {d['by']:10} {d['why']}")
    if not dups:
        print("duplicates: none")
    else:
        print(f"duplicates ({len(dups)}):")
        for e in dups:
            print(f"  {e.at}  {e.event:8} {e.actor:10} {e.flow_id or '-':14} {e.reason}")
    return 0


def blocked_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", metavar="T", help=SINCE_HELP)
    p.add_argument("--limit", type=positive_int, default=50, metavar="N", help="at most N duplicates (default 50)")
    p.add_argument("--json", action="store_true", help="print a JSON array instead of a table")


def blocked_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    since = parse_since(args.since, store.clock())
    rows = store.duplicates(since=since, limit=args.limit)
    if args.json:
        print_json(
            [
                {
                    "at": e.at,
                    "event": e.event,
                    "operation_id": r.operation_id,
                    "api": r.api,
                    "operation": r.operation,
                    "receipt_state": str(r.state),
                    "reason": e.reason,
                    "actor": e.actor,
                    "flow_id": e.flow_id,
                }
                for e, r in rows
            ]
        )
    elif not rows:
        print(f"no blocked or replayed duplicates in {store.location}" + (f" since {since}" if since else ""))
    else:
        print_table(
            ["TIME", "KIND", "RECEIPT", "OPERATION", "STATE", "REASON"],
            [[short_time(e.at), e.event, r.operation_id, operation_name(r), r.state, e.reason] for e, r in rows],
        )
    return 0


def export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", metavar="T", help="only receipts submitted " + SINCE_HELP.removeprefix("only "))
    p.add_argument(
        "--signed",
        action="store_true",
        help="a bundle `receipts verify BUNDLE` checks offline: every receipt, the hash chain of every event, the "
        "signed checkpoints and their verifier key (docs/proof.md); not with --since",
    )


def export_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    if args.signed:
        if args.since:
            raise UsageError("--signed exports the whole history (a chain verifies whole): not with --since")
        receipts = ((receipt_json(r), _decisions_of(store, r)) for r, _ in store.export(with_events=False))
        lines = bundle_lines(
            store.recorded_checkpoint_key(), iso(store.clock()), store.checkpoints(), store.chain_records(), receipts
        )
        for line in lines:
            sys.stdout.write(line)
        return 0
    since = parse_since(args.since, store.clock())
    for r, events in store.export(since=since):
        decisions = [dataclasses.asdict(d) for d in applied_decisions(events)]
        print(json.dumps({**receipt_json(r), "events": [event_json(e) for e in events], "decisions": decisions}))
    return 0


def _decisions_of(store: ReceiptStore, r: Receipt) -> list[dict] | None:
    """
    The decisions applied to a receipt, for its line of a signed bundle. Events this version cannot read
    (an edited state): None, said on stderr, and the bundle is written all the same: `verify` names the edit.
    """
    try:
        return [dataclasses.asdict(d) for d in applied_decisions(store.events(r.operation_id))]
    except StoreError as e:
        print(
            f"receipts export: receipt {r.operation_id}: its decisions cannot be read ({e}); exported without them",
            file=sys.stderr,
        )
        return None


def prune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--older-than",
        required=True,
        metavar="AGE",
        help="delete resolved receipts last changed more than AGE ago: 90m, 12h, 30d, 2w",
    )
    p.add_argument("--dry-run", action="store_true", help="only say how many would be deleted")


def prune_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    older_than = parse_age(args.older_than, "--older-than")
    try:
        ids = store.prune(older_than, dry_run=args.dry_run)
    except OverflowError:
        raise UsageError(f"--older-than: {args.older_than!r} is too long ago") from None
    noun = "receipt" if len(ids) == 1 else "receipts"
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {len(ids)} resolved {noun} last changed more than {args.older_than.strip()} ago")
    return 0
