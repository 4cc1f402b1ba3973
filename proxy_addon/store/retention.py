"""
Retention: `prune` deletes resolved receipts older than a cutoff, with their events and
decisions, keeping whatever a kept receipt's `retry_of` points at; and the budget charges and use of
windows that have ended (store/budgets.py).
"""

from __future__ import annotations

import datetime as dt

from proxy_addon.states import TERMINAL
from proxy_addon.store.base import marks
from proxy_addon.store.budgets import ReceiptBudgets
from proxy_addon.store.hash_chain import ReceiptChain
from proxy_addon.store.records import iso

_CHUNK = 500  # ids per DELETE in `prune` (under every driver's parameter limit)


class ReceiptRetention(ReceiptBudgets, ReceiptChain):
    """Pruning old resolved receipts."""

    def prune(self, older_than: dt.timedelta, *, dry_run: bool = False) -> list[str]:
        """
        Delete resolved receipts (succeeded, rejected, not_sent, safe_to_retry) last changed
        more than `older_than` ago, with their events. Never an unresolved one, and never one
        that a kept receipt's `retry_of` still points at. Returns the deleted ids. An operator's
        decision on a pruned receipt goes with it.
        """
        cutoff = iso(self.clock() - older_than)
        resolved = sorted(TERMINAL)
        with self._write():
            candidates = {
                r["operation_id"]
                for r in self._rows(
                    f"SELECT operation_id FROM receipts WHERE updated_at < ? AND state IN ({marks(len(resolved))})",
                    (cutoff, *resolved),
                )
            }
            links = [
                (r["operation_id"], r["retry_of"])
                for r in self._rows("SELECT operation_id, retry_of FROM receipts WHERE retry_of IS NOT NULL")
            ]
            changed = True
            while changed:  # keep whatever a kept receipt points at
                changed = False
                for operation_id, retry_of in links:
                    if operation_id not in candidates and retry_of in candidates:
                        candidates.discard(retry_of)
                        changed = True
            ids = sorted(candidates)
            if ids and not dry_run:
                self._defer_foreign_keys()  # a receipt goes before its events, and chains go in any order
                self._keep_links(ids)
                for chunk in (ids[i : i + _CHUNK] for i in range(0, len(ids), _CHUNK)):
                    self._execute(f"DELETE FROM approval_decisions WHERE operation_id IN ({marks(len(chunk))})", chunk)
                    self._execute(f"DELETE FROM receipts WHERE operation_id IN ({marks(len(chunk))})", chunk)
                    self._execute(f"DELETE FROM receipt_events WHERE operation_id IN ({marks(len(chunk))})", chunk)
            if not dry_run:
                self._forget_charges(self.clock())  # budgets' windows that have ended
        return ids

    def _keep_links(self, ids: list[str]) -> None:
        """What verification needs of the events about to go: their hashes, as `pruned` marks, and a `prune` mark."""
        events = []
        for chunk in (ids[i : i + _CHUNK] for i in range(0, len(ids), _CHUNK)):
            events += self._rows(
                f"SELECT chain_seq, prev_hash, hash FROM receipt_events WHERE operation_id IN ({marks(len(chunk))})",
                chunk,
            )
        at = iso(self.clock())
        runs = self._leave_links(events, at)
        self._mark("prune", f"pruned {len(ids)} receipts: {len(events)} events, in {runs} ranges", at)
