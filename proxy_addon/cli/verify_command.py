"""`receipts verify`: recompute the events' hash chain and check each receipt against it (docs/proof.md)."""

from __future__ import annotations

import argparse

from proxy_addon.proof.chain_audit import ChainAudit, SignedHead, Verdict
from proxy_addon.store import ReceiptStore


def verify_args(p: argparse.ArgumentParser) -> None:
    # `receipts verify --db DB` as well as `receipts --db DB verify` (SUPPRESS: the top level's value stays).
    p.add_argument("--db", default=argparse.SUPPRESS, help="the receipts database (as `receipts --db`)")


def verify_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    verdict = audit_store(store, [])
    print(verdict.line())
    return 0 if verdict.intact else 1


def audit_store(store: ReceiptStore, heads: list[SignedHead]) -> Verdict:
    """Walk the database's chain in order, then its receipts' states: the verdict."""
    audit = ChainAudit(heads)
    for kind, row in store.chain_records():
        if not audit.add("mark" if kind == "mark" else "event", row):
            break
    else:
        for operation_id, state in store.receipt_states():
            if not audit.receipt(operation_id, state):
                break
    return audit.verdict()
