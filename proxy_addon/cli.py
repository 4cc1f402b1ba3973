"""
`receipts`: see and settle the receipts the proxy wrote.

    receipts list --state outcome_unknown     the unresolved ones you care about
    receipts show 20261129T184210Z-1fd54b31a2 one receipt, its history and the duplicates it stopped
    receipts blocked --since 1d               what the proxy blocked or replayed lately
    receipts reconcile --all                  look for the effect of every unknown outcome with a read
    receipts resolve ID --as succeeded --note "the post is live" --external-id 1234567
    receipts export --since 2026-11-01 > audit.jsonl
    receipts prune --older-than 90d --dry-run
    receipts rules check                      validate the rules files
    receipts rules explain POST URL --body F  what a request would match and fingerprint; nothing is sent

Each subcommand is one entry in `COMMANDS`: a function adding its arguments, a function
running it against an open Store, and its help. Errors a user can fix are one line,
`Error: ...`, on stderr, with exit status 1; argparse's own usage errors exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import getpass
import json
import math
import os
import re
import sqlite3
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy_addon.errors import IllegalTransition, ReceiptsError, RulesError, StoreError
from proxy_addon.reconcile import reconcile
from proxy_addon.paths import default_db, default_rules, key_path
from proxy_addon.rules import Operation, check_rules_path, load_rules_path
from proxy_addon.states import RESOLUTIONS, State
from proxy_addon.store import Clock, Event, Receipt, Store, iso, utcnow

EPILOG = """\
examples:
  receipts list
  receipts list --state outcome_unknown --state manual_review
  receipts list --operation dev.to/articles.create --since 7d --json | jq '.[0]'
  receipts show 20261129T184210Z-1fd54b31a2
  receipts blocked --since 2h
  receipts reconcile --all --header 'api-key: ...'
  receipts resolve 20261129T184210Z-1fd54b31a2 --as succeeded --note "article is live" --external-id 1234567
  receipts export --since 2026-11-01 > receipts.jsonl
  receipts prune --older-than 90d --dry-run
  receipts rules check rules/
  receipts rules explain POST https://api.github.com/repos/o/r/issues --body issue.json
  receipts --db ./.state/receipts.db list

Run `receipts COMMAND --help` for a command's options.

The database is --db, else $RECEIPT_PROXY_DB, else $RECEIPT_PROXY_STATE_DIR/receipts.db,
else ~/.local/state/receipt-proxy/receipts.db (where scripts/run keeps it).
"""

SINCE_HELP = ("only since T: an ISO date or time (2026-11-01, 2026-11-01T12:00:00Z; UTC unless it says otherwise) "
              "or an age (90m, 2h, 7d)")
AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class UsageError(Exception):
    """A bad value the user can fix; printed as one `Error: ...` line, exit status 1."""


# --- values --------------------------------------------------------------------------------


def parse_age(text: str, option: str) -> dt.timedelta:
    """`90m`, `12h`, `30d`, `2w` (also `45s`) as a timedelta."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if not m:
        raise UsageError(f"{option}: {text!r} is not an age; use a number and a unit s, m, h, d or w, like 90m, 12h, 30d")
    try:
        return dt.timedelta(seconds=int(m[1]) * AGE_UNITS[m[2]])
    except OverflowError:
        raise UsageError(f"{option}: {text!r} is too long ago") from None


def parse_since(text: str | None, now: dt.datetime, option: str = "--since") -> str | None:
    """An ISO date/time or an age, as the store's time format (`2026-11-29T18:57:11.913481Z`)."""
    if text is None:
        return None
    if re.fullmatch(r"\s*\d+\s*[smhdw]\s*", text):
        try:
            return iso(now - parse_age(text, option))
        except OverflowError:
            raise UsageError(f"{option}: {text!r} is too long ago") from None
    try:
        t = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"{option}: {text!r} is neither an ISO date or time (2026-11-01, 2026-11-01T12:00:00Z) nor an age (90m, 2h, 7d)"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    try:
        return iso(t)
    except OverflowError:
        raise UsageError(f"{option}: {text!r} is out of range") from None


def age(since: str, now: dt.datetime) -> str:
    """How long ago an ISO time was, compactly: `45s`, `3m`, `2h`, `5d`."""
    seconds = int((now - dt.datetime.fromisoformat(since)).total_seconds())
    seconds = max(seconds, 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def positive_seconds(text: str) -> float:
    try:
        n = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(n) or n <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text}")
    return n


HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token


def sendable(value: str) -> bool:
    """Whether an HTTP/1.1 header can carry the value: printable ASCII, no CR, LF or other control."""
    return value.isascii() and value.isprintable()


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def cli_actor() -> str:
    """Who resolves: `cli:<login name>`, or `cli` when there is no login name."""
    try:
        user = getpass.getuser()
    except Exception:  # OSError without a login name or passwd entry; KeyError on older Pythons
        return "cli"
    return f"cli:{user}" if user else "cli"


# --- output --------------------------------------------------------------------------------


def receipt_json(r: Receipt) -> dict[str, Any]:
    """Every field of a receipt, JSON-ready: the recorded response as its status only (a body is bytes)."""
    d = {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "response"}
    d["state"] = str(r.state)
    d["response_status"] = r.response.status if r.response else None
    return d


def event_json(e: Event) -> dict[str, Any]:
    d = dataclasses.asdict(e)
    d["from_state"] = str(e.from_state) if e.from_state else None
    d["to_state"] = str(e.to_state)
    return d


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    """Aligned columns, `-` for an empty cell; the last column is not padded."""
    cells = [[("-" if v is None or v == "" else str(v)) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in [headers, *cells]) for i in range(len(headers) - 1)]
    for row in [headers, *cells]:
        print("  ".join([c.ljust(w) for c, w in zip(row, widths)] + [row[-1]]).rstrip())


def operation_name(r: Receipt) -> str:
    """`dev.to/articles.create`: what `receipts list --operation` takes."""
    return f"{r.api}/{r.operation}"


def short_time(t: str) -> str:
    """`2026-11-29T18:57:11.913481Z` → `2026-11-29T18:57:11Z`."""
    return t.split(".")[0] + "Z" if "." in t else t


# --- commands ------------------------------------------------------------------------------


def list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", action="append", choices=[s.value for s in State], default=[], metavar="STATE",
                   help=f"only receipts in this state (repeatable): {', '.join(s.value for s in State)}")
    p.add_argument("--operation", metavar="OP", help="only this operation: articles.create or dev.to/articles.create")
    p.add_argument("--since", metavar="T", help="only receipts submitted " + SINCE_HELP.removeprefix("only "))
    p.add_argument("--limit", type=positive_int, default=50, metavar="N", help="at most N receipts (default 50)")
    p.add_argument("--json", action="store_true", help="print a JSON array instead of a table")


def list_run(store: Store, args: argparse.Namespace) -> int:
    now = store.clock()
    since = parse_since(args.since, now)
    receipts = store.list(states=[State(s) for s in args.state], operation=args.operation, since=since,
                          limit=args.limit)
    dups = store.duplicate_counts([r.operation_id for r in receipts])
    if args.json:
        print_json([{**receipt_json(r), **dups[r.operation_id]} for r in receipts])
    elif not receipts:
        filtered = args.state or args.operation or since
        print(f"no receipts in {store.path}" + (" match these filters" if filtered else ""))
    else:
        print_table(
            ["ID", "AGE", "OPERATION", "STATE", "HTTP", "EXTERNAL-ID", "BLOCKED", "REPLAYED", "TARGET"],
            [[r.operation_id, age(r.submitted_at, now), operation_name(r), r.state, r.http_status, r.external_id,
              dups[r.operation_id]["blocked"] or None, dups[r.operation_id]["replayed"] or None, r.target]
             for r in receipts],
        )
    return 0


def show_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("operation_id", metavar="ID", help="the receipt's operation id (first column of `receipts list`)")
    p.add_argument("--json", action="store_true", help="print JSON: the receipt, its events and its duplicates")


def show_run(store: Store, args: argparse.Namespace) -> int:
    r = store.get(args.operation_id)
    every = store.events(r.operation_id)
    events = [e for e in every if e.event not in ("blocked", "replayed")]
    dups = [e for e in every if e.event in ("blocked", "replayed")]
    if args.json:
        print_json({**receipt_json(r), "events": [event_json(e) for e in events],
                    "duplicates": [event_json(e) for e in dups]})
        return 0
    for k, v in receipt_json(r).items():
        text = "-" if v is None else json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
        print(f"{k:19} {text}")
    print("events:")
    for e in events:
        change = f"{e.from_state or '(new)'} → {e.to_state}" if e.event == "transition" else e.event
        print(f"  {e.at}  {change:36} {e.actor:10} {e.reason}")
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


def blocked_run(store: Store, args: argparse.Namespace) -> int:
    since = parse_since(args.since, store.clock())
    rows = store.duplicates(since=since, limit=args.limit)
    if args.json:
        print_json([
            {"at": e.at, "event": e.event, "operation_id": r.operation_id, "api": r.api, "operation": r.operation,
             "receipt_state": str(r.state), "reason": e.reason, "actor": e.actor, "flow_id": e.flow_id}
            for e, r in rows
        ])
    elif not rows:
        print(f"no blocked or replayed duplicates in {store.path}" + (f" since {since}" if since else ""))
    else:
        print_table(
            ["TIME", "KIND", "RECEIPT", "OPERATION", "STATE", "REASON"],
            [[short_time(e.at), e.event, r.operation_id, operation_name(r), r.state, e.reason] for e, r in rows],
        )
    return 0


def resolve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("operation_id", metavar="ID", help="an outcome_unknown or manual_review receipt")
    p.add_argument("--as", dest="resolution", required=True, choices=[s.value for s in RESOLUTIONS],
                   help="what happened: succeeded (it took effect), safe_to_retry (it provably did not), "
                        "rejected (the API refused it)")
    p.add_argument("--note", required=True, help="why you know: recorded in the receipt's history")
    p.add_argument("--external-id", metavar="X", help="the id the API gave the created object (with --as succeeded)")


def resolve_run(store: Store, args: argparse.Namespace) -> int:
    if not args.note.strip():
        raise UsageError("--note must say how you know what happened")
    if args.external_id is not None and args.resolution != State.SUCCEEDED:
        raise UsageError(f"--external-id goes with --as succeeded, not --as {args.resolution}")
    before = store.get(args.operation_id).state
    r = store.resolve(args.operation_id, State(args.resolution), note=args.note.strip(), actor=cli_actor(),
                      external_id=args.external_id)
    print(f"{r.operation_id} is now {r.state} (was {before})")
    return 0


def reconcile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("operation_ids", metavar="ID", nargs="*", help="receipts to reconcile")
    p.add_argument("--all", action="store_true", help="every outcome_unknown and manual_review receipt")
    p.add_argument("--rules", default=None,
                   help="the rules file or folder with the reconcile specs (default: $RECEIPT_PROXY_RULES, else rules/)")
    p.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="a credential header for the reads (repeatable); default: the env var the rule names "
                        "in credentials.env")
    p.add_argument("--timeout", type=positive_seconds, default=30.0, help="seconds a read may take (default 30)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def reconcile_run(store: Store, args: argparse.Namespace) -> int:
    if bool(args.operation_ids) == args.all:
        raise UsageError("name the receipts to reconcile, or pass --all")
    headers = {}
    for h in args.header:
        name, sep, value = h.partition(":")
        if not sep or not HEADER_NAME.match(name.strip()):
            raise UsageError(f"--header {h.partition(':')[0]!r}...: not 'Name: value' with a header name")
        if not sendable(value.strip()):
            raise UsageError(f"--header {name.strip()}: the value has characters a header cannot carry "
                             "(only printable ASCII)")
        headers[name.strip().lower()] = value.strip()
    try:
        rules = load_rules_path(args.rules or default_rules())
    except RulesError as e:
        raise UsageError(f"--rules: {e}") from None
    if args.all:
        ids = [r.operation_id for r in store.list(states=[State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW], limit=None)]
    else:
        ids = [store.get(i).operation_id for i in args.operation_ids]  # unknown ids fail before any read
    results, failed = [], 0
    for n, operation_id in enumerate(ids, 1):
        before = store.get(operation_id)
        if len(ids) > 1:
            print(f"[{n}/{len(ids)}] {operation_id} {before.api}/{before.operation} ...", file=sys.stderr, flush=True)
        op = rules.operation(before.api, before.operation)
        credentials = headers or _env_credentials(op)
        try:
            after = reconcile(store, op, operation_id, credentials, actor=cli_actor(), timeout=args.timeout,
                              post_reads=rules.post_reads(before.api))
        except IllegalTransition as e:
            failed += 1
            print(f"Error: {e}", file=sys.stderr)
            continue
        reason = store.events(operation_id)[-1].reason
        results.append({"operation_id": operation_id, "operation": f"{after.api}/{after.operation}",
                        "from": str(before.state), "state": str(after.state),
                        "external_id": after.external_id, "reason": reason})
        if not args.json:
            print(f"{operation_id}  {before.state} → {after.state}  {reason}")
    if args.json:
        print(json.dumps(results, indent=2))
    elif not ids:
        print("nothing to reconcile: no outcome_unknown or manual_review receipts")
    return 1 if failed else 0


def _env_credentials(op: Operation | None) -> dict[str, str]:
    if op is None or not op.credentials_env or not op.credential_headers:
        return {}
    value = os.environ.get(op.credentials_env)
    if value and not sendable(value):
        raise UsageError(f"${op.credentials_env} has characters a header cannot carry (only printable ASCII; "
                         "a trailing newline or CR?)")
    if value and op.credentials_scheme:
        value = f"{op.credentials_scheme} {value}"
    return {op.credential_headers[0]: value} if value else {}


def export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", metavar="T", help="only receipts submitted " + SINCE_HELP.removeprefix("only "))


def export_run(store: Store, args: argparse.Namespace) -> int:
    since = parse_since(args.since, store.clock())
    for r, events in store.export(since=since):
        print(json.dumps({**receipt_json(r), "events": [event_json(e) for e in events]}))
    return 0


def prune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--older-than", required=True, metavar="AGE",
                   help="delete resolved receipts last changed more than AGE ago: 90m, 12h, 30d, 2w")
    p.add_argument("--dry-run", action="store_true", help="only say how many would be deleted")


def prune_run(store: Store, args: argparse.Namespace) -> int:
    older_than = parse_age(args.older_than, "--older-than")
    try:
        ids = store.prune(older_than, dry_run=args.dry_run)
    except OverflowError:
        raise UsageError(f"--older-than: {args.older_than!r} is too long ago") from None
    noun = "receipt" if len(ids) == 1 else "receipts"
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {len(ids)} resolved {noun} last changed more than {args.older_than.strip()} ago")
    return 0


@dataclass(frozen=True)
class Command:
    help: str
    description: str
    examples: list[str]
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Store, argparse.Namespace], int]
    uses_store: bool = True  # False: runs without a receipts database (`rules`)


def rules_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="rules_command", metavar="check|explain", required=True)
    check = sub.add_parser("check", help="validate rules files; print every problem as file:line: field: what",
                           description="Validate rules files and print every problem as file:line: field: what is wrong.")
    check.add_argument("paths", nargs="*", metavar="PATH",
                       help="rules files or folders (default: $RECEIPT_PROXY_RULES, else rules/)")
    ex = sub.add_parser(
        "explain", help="what the proxy would do with a request; nothing is sent",
        description="Show which operation a request matches (or why none does), what enters its fingerprint\n"
                    "(credentials are shown as REDACTED), how answers are classified and what a duplicate\n"
                    "would get. Nothing is sent.",
        epilog="examples:\n  receipts rules explain POST https://api.github.com/repos/o/r/issues --body issue.json\n"
               "  receipts rules explain POST https://api.stripe.com/v1/refunds --form 'payment_intent=pi_1&amount=500'\n"
               "  receipts rules explain POST https://api.linear.app/graphql --body create-issue.json "
               "--header 'Authorization: lin_api_...'\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ex.add_argument("method", metavar="METHOD")
    ex.add_argument("url", metavar="URL")
    ex.add_argument("--body", metavar="FILE", help="the request body, from a file ('-': standard input)")
    ex.add_argument("--form", metavar="FIELDS", help="a form-encoded body given inline, like 'amount=500&currency=usd'")
    ex.add_argument("--header", action="append", default=[], metavar="'K: V'",
                    help="a request header (repeatable); Content-Type defaults to JSON with --body")
    ex.add_argument("--rules", metavar="PATH", help="a rules file or folder (default: $RECEIPT_PROXY_RULES, else rules/)")
    ex.add_argument("--json", action="store_true", help="print the report as JSON")
    for sp in (check, ex):
        sp.set_defaults(uses_store=False)


def rules_run(store: Store | None, args: argparse.Namespace) -> int:
    if args.rules_command == "check":
        return _rules_check(args.paths or [default_rules()])
    return _rules_explain(args)


def _rules_check(paths: list[str]) -> int:
    bad = 0
    for path in paths:
        files, problems = check_rules_path(path)
        for problem in problems:
            print(problem, file=sys.stderr)
        bad += len(problems)
        failed = {p.source for p in problems}
        for file in files:
            if str(file) not in failed:
                print(f"ok  {file}: {len(load_rules_path(file).operations)} operations")
    if bad:
        print(f"{bad} problem{'s' if bad != 1 else ''}", file=sys.stderr)
    return 1 if bad else 0


def _rules_explain(args: argparse.Namespace) -> int:
    from proxy_addon import explain

    try:
        rules = load_rules_path(args.rules or default_rules())
    except RulesError as e:
        raise UsageError(f"--rules: {e}") from None
    headers: dict[str, str] = {}
    for h in args.header:
        name, colon, value = h.partition(":")
        if not colon or not name.strip():
            raise UsageError(f"--header {h.partition(':')[0]!r}...: not 'Name: value'")
        headers[name.strip().lower()] = value.strip()
    body = b""
    if args.body and args.form:
        raise UsageError("give --body or --form, not both")
    if args.body:
        try:
            body = sys.stdin.buffer.read() if args.body == "-" else Path(args.body).expanduser().read_bytes()
        except OSError as e:
            raise UsageError(f"--body: {e}") from None
        headers.setdefault("content-type", "application/json")
    elif args.form:
        body = args.form.encode()
        headers.setdefault("content-type", "application/x-www-form-urlencoded")
    key, note = _installation_key()
    try:
        report = explain.explain(rules, args.method, args.url, body, headers, key)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if note:
        report["key_note"] = note
    if report.get("fingerprint"):
        existing = _existing_receipt(report["fingerprint"]["value"])
        if existing is not None:
            report["existing"] = {"operation_id": existing.operation_id, "state": str(existing.state),
                                  "submitted_at": existing.submitted_at}
    print(json.dumps(report, indent=2, ensure_ascii=False) if args.json else explain.render(report))
    return 0


def _installation_key() -> tuple[bytes, str | None]:
    """The proxy's HMAC key beside the default database, read-only; else a throwaway one (and a note)."""
    path = key_path(default_db())
    try:
        key = path.read_bytes().strip()
        if len(key) >= 32:
            return key, None
    except OSError:
        pass
    return os.urandom(32), (f"no key at {path}: the principal and fingerprint were computed with a throwaway key, "
                            "so they differ from the proxy's; the fields above are what counts")


def _existing_receipt(fingerprint: str) -> Receipt | None:
    db = Path(default_db()).expanduser()
    if not db.exists():
        return None
    try:
        store = Store.open(db, create=False)
    except (ReceiptsError, sqlite3.Error):
        return None
    try:
        return store.latest_for(fingerprint)
    except (ReceiptsError, sqlite3.Error):
        return None
    finally:
        store.close()


COMMANDS: dict[str, Command] = {
    "list": Command(
        "list receipts, newest first",
        "List receipts, newest first, with how many duplicates each blocked or replayed.\n"
        "AGE is the time since the request was submitted.",
        ["receipts list", "receipts list --state outcome_unknown --state manual_review",
         "receipts list --operation dev.to/articles.create --since 7d",
         "receipts list --since 2026-11-01T12:00:00Z --limit 10 --json"],
        list_args, list_run,
    ),
    "show": Command(
        "one receipt, its history and its duplicates",
        "One receipt: its fields, its state changes, and the blocked or replayed duplicates of it.",
        ["receipts show 20261129T184210Z-1fd54b31a2", "receipts show 20261129T184210Z-1fd54b31a2 --json"],
        show_args, show_run,
    ),
    "blocked": Command(
        "duplicates the proxy blocked or replayed, newest first",
        "Duplicates the proxy blocked or answered with a recorded response (replayed), newest first,\n"
        "each with the receipt it was checked against and that receipt's current state.",
        ["receipts blocked", "receipts blocked --since 2h", "receipts blocked --since 2026-11-01 --json"],
        blocked_args, blocked_run,
    ),
    "resolve": Command(
        "settle an outcome_unknown or manual_review receipt by hand",
        "Record what you found out about a receipt whose outcome is unknown or under review.\n"
        "Until it is resolved, the proxy blocks identical requests; after safe_to_retry or\n"
        "rejected it forwards the next one as a retry. The change is recorded with your\n"
        "login name (actor cli:NAME) and the note.",
        ['receipts resolve 20261129T184210Z-1fd54b31a2 --as succeeded --note "article is live" --external-id 1234567',
         'receipts resolve 20261129T184210Z-1fd54b31a2 --as safe_to_retry --note "not on the dashboard after 1h"',
         'receipts resolve 20261129T184210Z-1fd54b31a2 --as rejected --note "support says it was refused"'],
        resolve_args, resolve_run,
    ),
    "reconcile": Command(
        "resolve unknown outcomes with a read, never another write",
        "Look for each receipt's effect with the read its rule's reconcile spec describes (GET or\n"
        "HEAD only): found → succeeded; absence proven and a retry allowed → safe_to_retry;\n"
        "anything else → manual_review. What was read is recorded in the receipt's history;\n"
        "credentials are used for the read and never stored.",
        ["receipts reconcile 20261129T184210Z-1fd54b31a2",
         "receipts reconcile --all --timeout 10",
         "receipts reconcile --all --header 'api-key: ...' --json",
         "receipts reconcile 20261129T184210Z-1fd54b31a2 --rules ./rules/dev.to.yaml"],
        reconcile_args, reconcile_run,
    ),
    "export": Command(
        "every receipt with its events, as JSON Lines",
        "Every receipt (oldest first) as one JSON object a line, with its events.\n"
        "A recorded response appears as its status only (response_status), never its body.",
        ["receipts export > receipts.jsonl", "receipts export --since 30d | jq -c 'select(.state == \"succeeded\")'"],
        export_args, export_run,
    ),
    "rules": Command(
        "check rules files, or explain what a request would match",
        "Rules tools: `check` validates files and prints every problem with file:line;\n"
        "`explain` shows what the proxy would do with a request, without sending it.",
        ["receipts rules check", "receipts rules check rules/github.yaml my-rules/",
         "receipts rules explain POST https://api.github.com/repos/o/r/issues --body issue.json"],
        rules_args, rules_run, uses_store=False,
    ),
    "prune": Command(
        "delete old resolved receipts",
        "Delete resolved receipts (succeeded, rejected, not_sent, safe_to_retry) last changed more\n"
        "than AGE ago, with their events. Unresolved receipts are never deleted, nor a receipt\n"
        "that a kept receipt is a retry of.",
        ["receipts prune --older-than 90d --dry-run", "receipts prune --older-than 30d"],
        prune_args, prune_run,
    ),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="receipts", description="See and settle the receipts receipt-proxy wrote.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", default=None, help="the receipts database (default: see below)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, c in COMMANDS.items():
        sp = sub.add_parser(
            name, help=c.help, description=c.description,
            epilog="examples:\n" + "".join(f"  {e}\n" for e in c.examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        c.add_arguments(sp)
    return p


def main(argv: list[str] | None = None, *, clock: Clock = utcnow) -> int:
    args = parser().parse_args(argv)
    if args.command is None:
        parser().print_help()
        return 0
    db = Path(args.db or default_db()).expanduser()
    store = None
    try:
        if not COMMANDS[args.command].uses_store:
            return COMMANDS[args.command].run(None, args)  # type: ignore[arg-type]
        try:
            store = Store.open(db, create=False, clock=clock)
        except StoreError as e:
            hint = "" if args.db or db.exists() else " (pass --db, or set $RECEIPT_PROXY_DB or $RECEIPT_PROXY_STATE_DIR)"
            raise StoreError(f"{e}{hint}") from e
        return COMMANDS[args.command].run(store, args)
    except (ReceiptsError, UsageError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except sqlite3.Error as e:
        print(f"Error: {db}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `receipts export | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    finally:
        if store is not None:
            store.close()


if __name__ == "__main__":
    sys.exit(main())
