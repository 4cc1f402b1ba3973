"""`receipts reconcile`: resolve unknown outcomes with a read, never another write."""

from __future__ import annotations

import argparse
import json
import os
import sys

from proxy_addon.cli.values import HEADER_NAME, UsageError, cli_actor, positive_seconds, sendable
from proxy_addon.errors import IllegalTransition, RulesError
from proxy_addon.paths import default_rules
from proxy_addon.reconcile import reconcile
from proxy_addon.rules import Operation, load_rules_path
from proxy_addon.states import State
from proxy_addon.store import Store


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
