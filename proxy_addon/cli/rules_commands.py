"""`receipts rules check` and `receipts rules explain`: rules files only, no receipts database needed."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from proxy_addon.cli.draft_command import draft_args, draft_run
from proxy_addon.cli.values import UsageError
from proxy_addon.errors import ReceiptsError, RulesError
from proxy_addon.gate.paths import default_db, default_rules, key_path
from proxy_addon.rules import check_rules_path, load_rules_path
from proxy_addon.rules.placeholders import placeholders
from proxy_addon.rules.todo_comments import todo_comments
from proxy_addon.store import Receipt, is_postgres, open_store


def rules_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="rules_command", metavar="check|explain|draft", required=True)
    check = sub.add_parser(
        "check",
        help="validate rules files; print every problem as file:line: field: what",
        description="Validate rules files and print every problem as file:line: field: what is wrong.",
    )
    check.add_argument(
        "paths", nargs="*", metavar="PATH", help="rules files or folders (default: $RECEIPT_PROXY_RULES, else rules/)"
    )
    ex = sub.add_parser(
        "explain",
        help="what the proxy would do with a request; nothing is sent",
        description="Show which operation a request matches (or why none does), what enters its fingerprint\n"
        "(credentials are shown as REDACTED), how answers are classified and what a duplicate\n"
        "would get. Nothing is sent.",
        epilog="examples:\n  receipts rules explain POST https://api.github.com/repos/o/r/issues --body issue.json\n"
        "  receipts rules explain POST https://api.stripe.com/v1/refunds --form 'payment_intent=pi_1&amount=500'\n"
        "  receipts rules explain POST https://api.linear.app/graphql --body create-issue.json "
        "--header 'Authorization: lin_api_...'\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ex.add_argument("method", metavar="METHOD", help="the request's method: POST, PUT, PATCH, DELETE, ...")
    ex.add_argument("url", metavar="URL", help="the request's full URL, https://host/path?query")
    ex.add_argument("--body", metavar="FILE", help="the request body, from a file ('-': standard input)")
    ex.add_argument("--form", metavar="FIELDS", help="a form-encoded body given inline, like 'amount=500&currency=usd'")
    ex.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'K: V'",
        help="a request header (repeatable); Content-Type defaults to JSON with --body",
    )
    ex.add_argument(
        "--rules", metavar="PATH", help="a rules file or folder (default: $RECEIPT_PROXY_RULES, else rules/)"
    )
    ex.add_argument("--json", action="store_true", help="print the report as JSON")
    for sp in (check, ex):
        sp.set_defaults(uses_store=False)
    draft_args(sub)


def rules_run(args: argparse.Namespace) -> int:
    if args.rules_command == "check":
        return _rules_check(args.paths or [default_rules()])
    if args.rules_command == "draft":
        return draft_run(args)
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
        for warning in [*placeholders(path), *todo_comments(path)]:
            print(f"warning: {warning}", file=sys.stderr)
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
            report["existing"] = {
                "operation_id": existing.operation_id,
                "state": str(existing.state),
                "submitted_at": existing.submitted_at,
            }
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
    return os.urandom(32), (
        f"no key at {path}: the principal and fingerprint were computed with a throwaway key, "
        "so they differ from the proxy's; the fields above are what counts"
    )


def _existing_receipt(fingerprint: str) -> Receipt | None:
    given = default_db()
    db: str | Path = given if is_postgres(given) else Path(given).expanduser()
    if isinstance(db, Path) and not db.exists():
        return None
    try:
        store = open_store(db, create=False)
    except ReceiptsError:
        return None
    try:
        return store.latest_for(fingerprint)
    except ReceiptsError:
        return None
    finally:
        store.close()
