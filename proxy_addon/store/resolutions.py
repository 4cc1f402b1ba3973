"""
Settling an unknown outcome: by hand (`resolve`, from `receipts resolve`) or by claiming the
receipt for a read (`claim_for_reconcile`, for reconcile/settle.py); one claimant wins.
"""

from __future__ import annotations

from typing import Any

from proxy_addon.errors import IllegalTransition
from proxy_addon.states import RESOLUTIONS, State
from proxy_addon.store.records import Receipt
from proxy_addon.store.transitions import ReceiptTransitions


class ReceiptResolutions(ReceiptTransitions):
    """Resolving an `outcome_unknown` or `manual_review` receipt by hand, or claiming it for a read."""

    def resolve(
        self, operation_id: str, to: State, *, note: str, actor: str, external_id: str | None = None
    ) -> Receipt:
        """
        A human decision: `outcome_unknown` or `manual_review` → succeeded, safe_to_retry or
        rejected. An `outcome_unknown` receipt passes through `manual_review` (two events, one
        transaction). Anything else raises IllegalTransition.
        """
        if to not in RESOLUTIONS:
            raise IllegalTransition(f"a receipt can be resolved as {', '.join(RESOLUTIONS)}, not {to}")
        if not note.strip():
            raise ValueError("a resolution needs a note saying why")
        fields: dict[str, Any] = {"external_id": external_id} if external_id else {}
        with self._write(receipt=operation_id):
            current = self.get(operation_id).state
            if current is State.OUTCOME_UNKNOWN:
                self._step(
                    operation_id,
                    State.MANUAL_REVIEW,
                    frozenset({current}),
                    {},
                    f"taken into review: {note}",
                    actor,
                    None,
                )
                current = State.MANUAL_REVIEW
            if current is not State.MANUAL_REVIEW:
                raise IllegalTransition(
                    f"receipt {operation_id} is {current}; "
                    "only outcome_unknown and manual_review receipts are resolved by hand"
                )
            self._step(
                operation_id, to, frozenset({State.MANUAL_REVIEW}), fields, f"resolved by hand: {note}", actor, None
            )
        return self.get(operation_id)

    def claim_for_reconcile(self, operation_id: str, *, actor: str, reason: str = "reconciling with a read") -> Receipt:
        """
        `outcome_unknown`/`manual_review` → `reconciling`. Only one claimant wins;
        the others get IllegalTransition.
        """
        with self._write(receipt=operation_id):
            self._step(
                operation_id,
                State.RECONCILING,
                frozenset({State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW}),
                {},
                reason,
                actor,
                None,
            )
        return self.get(operation_id)
