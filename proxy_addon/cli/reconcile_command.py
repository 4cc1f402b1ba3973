"""
`receipts reconcile`: resolve unknown outcomes with a read, never another write.

The same reconcile the proxy runs (proxy_addon/reconcile/settle.py), under `asyncio.run`. Reads
verify TLS like the proxy's: `--cacert FILE` (else $SSL_CERT_FILE / $SSL_CERT_DIR, else the
certifi bundle), or `--insecure`. A read that fails (a transport error, an answer that is not
2xx or cannot be judged) proves nothing: the receipt stays outcome_unknown with the time of
its next read ("next read not before ..."; manual_review after --read-attempts failed reads or
past --read-deadline), the command says which receipts and why on stderr, and exits 1. A
receipt that waits for its next read (a failed read's Retry-After or backoff, a settle delay)
is not read before then ("next read after ..."), unless `--now`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from proxy_addon.cli import cli_spans
from proxy_addon.cli.values import (
    HEADER_NAME,
    UsageError,
    cli_actor,
    positive_int,
    positive_seconds,
    seconds_or_age,
    sendable,
)
from proxy_addon.errors import IllegalTransition, RulesError
from proxy_addon.gate.paths import default_rules, key_path
from proxy_addon.intent.fingerprint import principal
from proxy_addon.reconcile.http_reads import ReadSettings
from proxy_addon.reconcile.settle import Reconciled, reconcile, retry_after
from proxy_addon.rules import Operation, RuleSet, load_rules_path
from proxy_addon.states import State
from proxy_addon.store import Receipt, ReceiptStore, iso
from proxy_addon.wire.redaction import credential_names
from proxy_addon.wire.upstream import Upstream

if TYPE_CHECKING:
    from proxy_addon.gate.receipt_spans import ReceiptSpans

T = TypeVar("T")


def reconcile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("operation_ids", metavar="ID", nargs="*", help="receipts to reconcile")
    p.add_argument("--all", action="store_true", help="every outcome_unknown and manual_review receipt")
    p.add_argument(
        "--rules",
        default=None,
        help="the rules file or folder with the reconcile specs (default: $RECEIPT_PROXY_RULES, else rules/)",
    )
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a credential header for the reads (repeatable); default: the env var the rule names in credentials.env",
    )
    p.add_argument("--timeout", type=positive_seconds, default=30.0, help="seconds a read may take (default 30)")
    p.add_argument(
        "--cacert",
        metavar="FILE",
        help="trust this CA bundle for the reads (default: $SSL_CERT_FILE, else the certifi bundle), "
        "like the proxy's ssl_verify_upstream_trusted_ca",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="do not verify the upstream's certificate (like the proxy's ssl_insecure)",
    )
    p.add_argument(
        "--read-attempts",
        type=positive_int,
        default=ReadSettings.attempts,
        metavar="N",
        help="failed reads after which a receipt goes to manual_review (default 3, as receipts_read_attempts)",
    )
    p.add_argument(
        "--read-deadline",
        type=seconds_or_age,
        default=ReadSettings.deadline,
        metavar="T",
        help="seconds or an age (90m, 24h): a read that fails this long after the outcome became unknown "
        "sends the receipt to manual_review (default 24h, as receipts_read_deadline)",
    )
    p.add_argument(
        "--read-backoff",
        type=positive_seconds,
        default=ReadSettings.backoff,
        metavar="S",
        help="seconds before the next read after a failed one, doubling (default 30, as receipts_read_backoff); "
        "a Retry-After in the failed read's answer is used instead",
    )
    p.add_argument(
        "--now",
        action="store_true",
        help="read receipts that wait for their next read (after a failed read or a settle delay) at once",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def reconcile_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    if bool(args.operation_ids) == args.all:
        raise UsageError("name the receipts to reconcile, or pass --all")
    headers = _header_credentials(args.header)
    try:
        rules = load_rules_path(args.rules or default_rules())
    except RulesError as e:
        raise UsageError(f"--rules: {e}") from None
    if args.all:
        ids = [r.operation_id for r in store.list(states=[State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW], limit=None)]
    else:
        ids = [store.get(i).operation_id for i in args.operation_ids]  # unknown ids fail before any read
    upstream = Upstream.from_env(ca_file=args.cacert, insecure=args.insecure)
    with cli_spans.opened() as spans:  # OpenTelemetry (OTEL_EXPORTER_OTLP_*): a linked span per receipt
        results, errors = asyncio.run(_reconcile_all(store, rules, ids, headers, upstream, args, spans))
    if args.json:
        print(json.dumps(results, indent=2))
    elif not ids:
        print("nothing to reconcile: no outcome_unknown or manual_review receipts")
    failed_reads = [r for r in results if r["read_failed"]]
    if failed_reads:
        noun = "read" if len(failed_reads) == 1 else "reads"
        print(f"Error: {len(failed_reads)} {noun} failed and proved nothing:", file=sys.stderr)
        for r in failed_reads:
            print(f"  {r['operation_id']} {r['operation']}: {r['reason']}", file=sys.stderr)
    return 1 if errors or failed_reads else 0


async def _reconcile_all(
    store: ReceiptStore,
    rules: RuleSet,
    ids: list[str],
    headers: dict[str, str],
    upstream: Upstream,
    args: argparse.Namespace,
    spans: ReceiptSpans | None = None,
) -> tuple[list[dict[str, Any]], int]:
    async def calls(fn: Callable[[ReceiptStore], T]) -> T:
        return fn(store)

    results, errors = [], 0
    key = _installation_key(store)
    for n, operation_id in enumerate(ids, 1):
        before = store.get(operation_id)
        if len(ids) > 1:
            print(f"[{n}/{len(ids)}] {operation_id} {before.api}/{before.operation} ...", file=sys.stderr, flush=True)
        op = rules.operation(before.api, before.operation)
        waits = None if args.now else retry_after(op, before, store.clock())
        if waits is not None:  # a failed read's Retry-After or backoff, or settle: not read before then
            results.append(_waiting(before, waits))
            if not args.json:
                print(f"{operation_id}  {before.state}  {results[-1]['reason']}")
            continue
        settings = ReadSettings(
            upstream=upstream,
            timeout=args.timeout,
            post_reads=rules.post_reads(before.api),
            attempts=args.read_attempts,
            deadline=args.read_deadline,
            backoff=args.read_backoff,
        )
        credentials = headers or _env_credentials(op)
        if (mismatch := _not_the_writes(before, op, credentials, key)) is not None:
            errors += 1
            print(f"Error: {operation_id} not read: {mismatch}", file=sys.stderr)
            continue
        with cli_spans.change(spans, "receipt.reconcile", before) as span:
            try:
                done = await reconcile(calls, op, operation_id, credentials, settings=settings, actor=cli_actor())
            except IllegalTransition as e:
                errors += 1
                print(f"Error: {e}", file=sys.stderr)
                continue
            if span is not None:
                span.set_attributes(
                    {
                        "receipt.state": str(done.receipt.state),
                        "receipt.read": done.read,
                        "receipt.reason": done.verdict.reason,
                    }
                )
        results.append(_result(before, done))
        if not args.json:
            print(f"{operation_id}  {before.state} → {done.receipt.state}  {done.verdict.reason}")
    return results, errors


def _installation_key(store: ReceiptStore) -> bytes | None:
    """The proxy's HMAC key beside the database (read-only), to tell whose credentials a read carries."""
    try:
        key = key_path(store.path or store.location).read_bytes().strip()
    except OSError:
        return None
    return key if len(key) >= 32 else None


def _not_the_writes(
    receipt: Receipt, op: Operation | None, credentials: dict[str, str], key: bytes | None
) -> str | None:
    """
    Why a read with these credentials could look in the wrong place, or None. A write made for
    one account (a key, plus Stripe-Account or on-behalf-of) is only found, or proven absent,
    by a read for that account: credentials whose principal is not the write's are refused.
    Without credentials (the read answers 401, a failed read) or without the key, nothing is checked.
    """
    if op is None or key is None or not credentials or not receipt.principal.startswith("hmac:"):
        return None
    # The principal the rule's credential headers make: the write's, or, when more than those made
    # it (a key in its query, body or path too: intent/caller.py), the one kept for its headers alone.
    if principal(op.credential_headers, credentials, key) == (receipt.read_principal or receipt.principal):
        return None
    names = ", ".join(credential_names(op.credential_headers))
    return (
        "the credentials given are not those the write was sent with (another key, or another account), so a "
        f"read with them could look in the wrong place and prove nothing, or prove it absent; pass the write's "
        f"own credential headers ({names}) with --header"
    )


def _result(before: Receipt, done: Reconciled) -> dict[str, Any]:
    after = done.receipt
    return {
        "operation_id": after.operation_id,
        "operation": f"{after.api}/{after.operation}",
        "from": str(before.state),
        "state": str(after.state),
        "external_id": after.external_id,
        "reason": done.verdict.reason,
        "read_failed": done.verdict.failed,
        "next_read_at": after.next_read_at,
        "skipped": False,
    }


def _waiting(before: Receipt, at: dt.datetime) -> dict[str, Any]:
    """The result for a receipt not read because it waits for its next read."""
    n = before.failed_reads
    why = f"{n} failed read{'' if n == 1 else 's'} so far" if n else "a read proves absence only then"
    return {
        "operation_id": before.operation_id,
        "operation": f"{before.api}/{before.operation}",
        "from": str(before.state),
        "state": str(before.state),
        "external_id": before.external_id,
        "reason": f"not read: next read after {iso(at)} ({why}); --now reads it at once",
        "read_failed": False,
        "next_read_at": before.next_read_at,
        "skipped": True,
    }


def _header_credentials(given: list[str]) -> dict[str, str]:
    """`--header 'Name: value'` options as credential headers (lower-case names)."""
    headers = {}
    for h in given:
        name, sep, value = h.partition(":")
        if not sep or not HEADER_NAME.match(name.strip()):
            raise UsageError(f"--header {h.partition(':')[0]!r}...: not 'Name: value' with a header name")
        if not sendable(value.strip()):
            raise UsageError(
                f"--header {name.strip()}: the value has characters a header cannot carry (only printable ASCII)"
            )
        headers[name.strip().lower()] = value.strip()
    return headers


def _env_credentials(op: Operation | None) -> dict[str, str]:
    if op is None or not op.credentials_env or not op.credential_headers:
        return {}
    value = os.environ.get(op.credentials_env)
    if value and not sendable(value):
        raise UsageError(
            f"${op.credentials_env} has characters a header cannot carry (only printable ASCII; "
            "a trailing newline or CR?)"
        )
    if value and op.credentials_scheme:
        value = f"{op.credentials_scheme} {value}"
    return {op.credential_headers[0]: value} if value else {}
