"""
The verdict on a history (docs/proof.md, "Verifying"), from its parts however they are read (a
database, a bundle): the checkpoints' signatures first, then the chain in order, then each
receipt's state. `receipts verify` prints `verdict.line()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from proxy_addon.proof.chain_audit import ChainAudit, SignedHead, Verdict
from proxy_addon.proof.checkpoint_notes import NoteError, open_checkpoint


def verdict_of(
    records: Iterable[tuple[str, dict[str, Any]]],
    receipts: Iterable[tuple[str, str]],
    checkpoints: Iterable[dict[str, Any]],
    verifier: str | None,
) -> Verdict:
    """`records`: ("event" | "mark", row) by position; `receipts`: (id, state); `checkpoints`: rows."""
    try:
        heads = list(signed_heads(checkpoints, verifier))
    except NoteError as e:
        return Verdict(False, 0, None, str(e))
    chain = ChainAudit(heads)
    for kind, row in records:
        if not chain.add("mark" if kind == "mark" else "event", row):
            break
    else:
        for operation_id, state in receipts:
            if not chain.receipt(operation_id, state):
                break
    return chain.verdict()


def signed_heads(checkpoints: Iterable[dict[str, Any]], verifier: str | None) -> Iterator[SignedHead]:
    """What each checkpoint signed; NoteError naming the first that does not verify."""
    for c in checkpoints:
        where = f"the checkpoint at position {c['size']} ({c['at']})"
        if verifier is None:
            raise NoteError(f"{where} cannot be checked: no verifier key (none recorded; --public-key)")
        try:
            head = open_checkpoint(str(c["note"]), verifier)
        except ValueError as e:  # NoteError too
            raise NoteError(f"{where}: {e}") from None
        if (head.size, head.head) != (int(c["size"]), c["head"]):
            raise NoteError(f"{where}: its row says another size or head than its signed note (edited)")
        yield head
