"""
`receipts pending`, `receipts approve`, `receipts deny`: writes held for approval, decided at a terminal.

A decision is recorded in the store (`decide_approval`) for the proxy that holds the write,
which applies it within a second, as mitmweb's Resume or Abort would. These commands then
wait (`--wait`, 5 s) to say what became of the receipt: exit 0 when the decision was applied,
1 when it was refused (nothing written), when someone else decided first (mitmweb, the
timeout, the agent hanging up), or when the proxy did not apply it in time (it stays recorded).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path

from proxy_addon.cli.output import operation_name, print_json, print_table, receipt_json
from proxy_addon.cli.values import UsageError, age, cli_actor, positive_int
from proxy_addon.errors import ReceiptsError, StoreError
from proxy_addon.gate import instances
from proxy_addon.states import State
from proxy_addon.store import ApprovalDecision, PostgresStore, Receipt, ReceiptStore

WAIT_POLL = 0.1  # seconds between two looks at the receipt while waiting for the proxy
FINGERPRINT = re.compile(r"(?:sha256:)?([0-9a-fA-F]{8,64})")
SHOWN = 12  # hex digits of the fingerprint `pending` shows


def _running(store: ReceiptStore, instance: str | None) -> bool:
    """Whether the proxy instance that holds a write still runs (its lock is held; on PostgreSQL, its lease)."""
    if isinstance(store, PostgresStore):
        return bool(instance) and instance in store.live_instances()
    db = Path(store.location)
    try:
        return instances.alive(db, instance, tidy=False)
    except OSError as e:
        raise StoreError(f"cannot tell whether the proxy {instance} still runs: {e}") from e


def _proxy(store: ReceiptStore, r: Receipt) -> str | None:
    """`pid:N` of the running proxy that holds the write, or None when it has stopped."""
    if not _running(store, r.instance):
        return None
    if isinstance(store, PostgresStore):
        return r.instance  # host-pid-token: the fleet spans machines
    return f"pid:{(r.instance or '').split('-')[0]}"


def _short(fingerprint: str) -> str:
    scheme, _, digest = fingerprint.rpartition(":")
    return f"{scheme}:{digest[:SHOWN]}" if scheme else digest[:SHOWN]


def _decision_json(d: ApprovalDecision | None) -> dict | None:
    if d is None:
        return None
    return {"decision": d.decision, "note": d.note, "actor": d.actor, "decided_at": d.decided_at}


def pending_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=positive_int, default=50, metavar="N", help="at most N writes (default 50)")
    p.add_argument("--json", action="store_true", help="print a JSON array instead of a table")


def pending_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    now = store.clock()
    receipts = store.list(states=[State.AWAITING_APPROVAL], limit=args.limit)
    decided = store.approval_decisions([r.operation_id for r in receipts])
    held_by = {r.operation_id: _proxy(store, r) for r in receipts}
    if args.json:
        print_json(
            [
                {
                    **receipt_json(r),
                    "held_by": held_by[r.operation_id],
                    "decision": _decision_json(decided.get(r.operation_id)),
                }
                for r in receipts
            ]
        )
    elif not receipts:
        print(f"no writes awaiting approval in {store.location}")
    else:
        print_table(
            ["ID", "AGE", "OPERATION", "PROXY", "DECISION", "PRINCIPAL", "FINGERPRINT", "INTENT"],
            [
                [
                    r.operation_id,
                    age(r.submitted_at, now),
                    operation_name(r),
                    held_by[r.operation_id] or "stopped",
                    d.decision if (d := decided.get(r.operation_id)) else None,
                    r.principal,
                    _short(r.intent_fingerprint),
                    json.dumps(r.intent, sort_keys=True, separators=(",", ":")),
                ]
                for r in receipts
            ],
        )
    return 0


def _wait_seconds(text: str) -> float:
    try:
        n = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(n) or n < 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more, not {text}")
    return n


def _decide_args(p: argparse.ArgumentParser, *, deny: bool) -> None:
    p.add_argument("operation_id", metavar="ID", help="a receipt awaiting approval (the first column of pending)")
    p.add_argument(
        "--note",
        required=deny,
        default="",
        help="why: recorded in the receipt's history" + (", and told to the agent in its 403" if deny else ""),
    )
    p.add_argument(
        "--fingerprint",
        metavar="F",
        help="decide only if the receipt's intent fingerprint starts with F (as `receipts pending` shows it, "
        "at least 8 hex digits)",
    )
    p.add_argument(
        "--wait",
        type=_wait_seconds,
        default=5.0,
        metavar="S",
        help="seconds to wait for the proxy to apply the decision (default 5; 0: record it and exit)",
    )


def approve_args(p: argparse.ArgumentParser) -> None:
    _decide_args(p, deny=False)


def deny_args(p: argparse.ArgumentParser) -> None:
    _decide_args(p, deny=True)


def approve_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    return _decide(store, args, approve=True)


def deny_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    return _decide(store, args, approve=False)


def _fingerprint(text: str | None) -> str | None:
    if text is None:
        return None
    m = FINGERPRINT.fullmatch(text.strip())
    if not m:
        raise UsageError(f"--fingerprint: {text!r} is not a fingerprint; give at least 8 hex digits, as pending shows")
    return f"sha256:{m[1].lower()}"


def _decide(store: ReceiptStore, args: argparse.Namespace, *, approve: bool) -> int:
    note = args.note.strip()
    if not approve and not note:
        raise UsageError("--note must say why the write is denied: the agent gets it in its 403")
    d = store.decide_approval(
        args.operation_id,
        approve=approve,
        note=note,
        actor=cli_actor(),
        fingerprint=_fingerprint(args.fingerprint),
        is_alive=lambda instance: _running(store, instance),
    )
    if args.wait == 0:
        print(f"{d.operation_id} {d.decision} by {d.actor}: recorded for the proxy that holds it")
        return 0
    deadline = time.monotonic() + args.wait
    r = store.get(d.operation_id)
    while r.state is State.AWAITING_APPROVAL and time.monotonic() < deadline:
        time.sleep(WAIT_POLL)
        r = store.get(d.operation_id)
    if r.state is State.AWAITING_APPROVAL:
        raise ReceiptsError(
            f"receipt {d.operation_id}: {d.decision} by {d.actor} is recorded, but the proxy that holds it has not "
            f"applied it within {args.wait:g}s; it applies it when it can (see receipts pending)"
        )
    used = store.approval_decision(d.operation_id)
    if used is None or used.consumed_at is None:
        last = next((e for e in reversed(store.events(d.operation_id)) if e.event == "transition"), None)
        how = f" by {last.actor} ({last.reason})" if last is not None else ""
        raise ReceiptsError(
            f"receipt {d.operation_id} was decided otherwise before the proxy applied yours: {r.state}{how}; "
            f"your decision ({d.decision}) was not used"
        )
    said = f": {note}" if note else ""
    print(f"{d.operation_id} is now {r.state} (was awaiting_approval): {d.decision} by {d.actor}{said}")
    return 0
