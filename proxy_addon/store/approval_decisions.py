"""
Operators' decisions on writes held for approval: recorded once (`decide_approval`, from
`receipts approve` / `deny`), then applied once by the proxy that holds the write
(`apply_approval`), the decision marked used in the transaction that moves its receipt.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy_addon.errors import IllegalTransition, LinkUsed
from proxy_addon.states import State
from proxy_addon.store.records import ApprovalDecision, Receipt, iso
from proxy_addon.store.transitions import ReceiptTransitions


class ReceiptApprovals(ReceiptTransitions):
    """Recording and applying an operator's decision on a held write."""

    def decide_approval(
        self,
        operation_id: str,
        *,
        approve: bool,
        note: str,
        actor: str,
        fingerprint: str | None = None,
        is_alive: Callable[[str | None], bool] = lambda instance: True,
        rules_version: str | None = None,
        link: str | None = None,
    ) -> ApprovalDecision:
        """
        Record an operator's decision on a write held for approval (`receipts approve` / `deny`),
        for the proxy that holds it to apply (`apply_approval`). Refused with IllegalTransition,
        nothing written, unless the receipt is `awaiting_approval`, has no decision yet, is held
        by a proxy that is running (`is_alive(receipt.instance)`) and, when `fingerprint` is
        given, has an intent fingerprint that starts with it. An unknown id: UnknownReceipt.
        `rules_version` (a link's): the holding proxy applies an approval only under that version
        of its rules; `link`: the id of the link that decides, recorded so that it decides once
        (LinkUsed when it already did).
        """
        if not approve and not note.strip():
            raise ValueError("a denial needs a note saying why")
        with self._write(receipt=operation_id):
            r, earlier = self.get(operation_id), self.approval_decision(operation_id)
            _check_decidable(r, earlier, fingerprint=fingerprint, link=link, is_alive=is_alive)
            self._execute(
                "INSERT INTO approval_decisions (operation_id, intent_fingerprint, decision, note, actor, decided_at, "
                "rules_version, link) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    operation_id,
                    r.intent_fingerprint,
                    "approved" if approve else "denied",
                    note.strip(),
                    actor,
                    iso(self.clock()),
                    rules_version,
                    link,
                ),
            )
        decision = self.approval_decision(operation_id)
        assert decision is not None
        return decision

    def apply_approval(
        self, decision: ApprovalDecision, *, fingerprint: str, reason: str, flow_id: str | None = None
    ) -> Receipt:
        """
        Apply an operator's decision to the write this proxy holds, in one transaction: the
        decision is marked used, and the receipt moves `awaiting_approval` → `submitted`
        (approved) or `rejected` (denied; `error` is `reason`), the event naming the decider.
        `fingerprint` is the held write's. A decision used already or changed, one for another
        intent, or a receipt no longer awaiting approval: IllegalTransition, nothing written.
        """
        operation_id = decision.operation_id
        to, fields = (State.SUBMITTED, {}) if decision.approved else (State.REJECTED, {"error": reason})
        with self._write(receipt=operation_id):
            r = self.get(operation_id)
            if not fingerprint == r.intent_fingerprint == decision.intent_fingerprint:
                raise IllegalTransition(
                    f"the decision on receipt {operation_id} is for the intent {decision.intent_fingerprint}; "
                    f"the receipt's is {r.intent_fingerprint} and the held write's {fingerprint}: not applied"
                )
            used = self._execute(
                "UPDATE approval_decisions SET consumed_at = ? WHERE operation_id = ? AND intent_fingerprint = ? "
                "AND decision = ? AND consumed_at IS NULL",
                (iso(self.clock()), operation_id, fingerprint, decision.decision),
            )
            if used != 1:
                raise IllegalTransition(f"the decision on receipt {operation_id} was used already, or changed")
            self._step(operation_id, to, frozenset({State.AWAITING_APPROVAL}), fields, reason, decision.actor, flow_id)
        return self.get(operation_id)


def _check_decidable(
    r: Receipt,
    earlier: ApprovalDecision | None,
    *,
    fingerprint: str | None,
    link: str | None,
    is_alive: Callable[[str | None], bool],
) -> None:
    """Refuse (IllegalTransition, LinkUsed) a decision `decide_approval` must not record."""
    operation_id = r.operation_id
    if earlier is not None and link is not None and earlier.link == link:
        raise LinkUsed(
            f"this link was used already: receipt {operation_id} was {earlier.decision} with it by "
            f"{earlier.actor} at {earlier.decided_at}; it is now {r.state}"
        )
    if r.state is not State.AWAITING_APPROVAL:
        raise IllegalTransition(
            f"receipt {operation_id} is {r.state}, not awaiting_approval: only a write held for approval "
            "can be approved or denied"
        )
    if earlier is not None:
        raise IllegalTransition(
            f"receipt {operation_id} was already {earlier.decision} by {earlier.actor} "
            f"at {earlier.decided_at}: a held write is decided once"
        )
    if fingerprint is not None and not r.intent_fingerprint.startswith(fingerprint):
        raise IllegalTransition(
            f"receipt {operation_id} has the intent fingerprint {r.intent_fingerprint}, not {fingerprint}...: "
            "it is not the write you meant"
        )
    if not is_alive(r.instance):
        raise IllegalTransition(
            f"receipt {operation_id} is not held: the proxy that held it (instance {r.instance}) has stopped; "
            "nothing was sent, and the next proxy start records it not_sent"
        )
