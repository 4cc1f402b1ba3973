"""`receipts verify`: recompute the events' hash chain, check its signed checkpoints, and each receipt's state."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from proxy_addon.cli.values import UsageError
from proxy_addon.proof.chain_audit import ChainAudit, Kind, SignedHead, Verdict
from proxy_addon.proof.checkpoint_notes import NoteError, open_checkpoint
from proxy_addon.store import ReceiptStore


def verify_args(p: argparse.ArgumentParser) -> None:
    # `receipts verify --db DB` as well as `receipts --db DB verify` (SUPPRESS: the top level's value stays).
    p.add_argument("--db", default=argparse.SUPPRESS, help="the receipts database (as `receipts --db`)")
    p.add_argument(
        "--public-key",
        metavar="KEY",
        help="the verifier key checkpoints must be signed with (receipt-proxy+<id>+<base64>, or a file holding it); "
        "default: the one the database records",
    )


def verify_run(store: ReceiptStore, args: argparse.Namespace) -> int:
    verdict = audit_store(store, given_verifier(args.public_key))
    print(verdict.line())
    return 0 if verdict.intact else 1


def audit_store(store: ReceiptStore, verifier: str | None = None) -> Verdict:
    """The database's verdict, its checkpoints checked with `verifier`, else with the key it records."""
    verifier = verifier or store.recorded_checkpoint_key()
    return audit(store.chain_records(), store.receipt_states(), store.checkpoints(), verifier)


def given_verifier(value: str | None) -> str | None:
    """--public-key: a verifier key, or a file holding one."""
    if value is None:
        return None
    if "+" not in value and Path(value).is_file():
        return Path(value).read_text().strip()
    if "+" not in value:
        raise UsageError(f"--public-key: {value!r} is neither a verifier key (receipt-proxy+...) nor a file")
    return value.strip()


def audit(
    records: Iterable[tuple[str, dict[str, Any]]],
    receipts: Iterable[tuple[str, str]],
    checkpoints: Iterable[dict[str, Any]],
    verifier: str | None,
) -> Verdict:
    """The checkpoints' signatures, then the chain in order, then each receipt's state: the verdict."""
    try:
        heads = list(_signed_heads(checkpoints, verifier))
    except NoteError as e:
        return Verdict(False, 0, None, str(e))
    chain = ChainAudit(heads)
    for kind, row in records:
        if not chain.add(_kind(kind), row):
            break
    else:
        for operation_id, state in receipts:
            if not chain.receipt(operation_id, state):
                break
    return chain.verdict()


def _kind(kind: str) -> Kind:
    return "mark" if kind == "mark" else "event"


def _signed_heads(checkpoints: Iterable[dict[str, Any]], verifier: str | None) -> Iterator[SignedHead]:
    """What each checkpoint signed; NoteError naming the first that does not verify."""
    for c in checkpoints:
        where = f"the checkpoint at position {c['size']} ({c['at']})"
        if verifier is None:
            raise NoteError(f"{where} cannot be checked: no verifier key (the database records none; --public-key)")
        try:
            head = open_checkpoint(str(c["note"]), verifier)
        except (NoteError, ValueError) as e:
            raise NoteError(f"{where}: {e}") from None
        if (head.size, head.head) != (int(c["size"]), c["head"]):
            raise NoteError(f"{where}: its row says another size or head than its signed note (edited)")
        yield head
